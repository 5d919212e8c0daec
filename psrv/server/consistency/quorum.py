"""Quorum merges, a setting of sync (`--quorum Q`; Decoupled DiLoCo's minimum quorum, arXiv 2604.21428): a
shard buffers pushes of any clock into the open merge, and applies their mean as ONE step once Q distinct
workers still pushing are in it (or every one of them is, when fewer than Q push). Every pull is answered at
once: no worker waits for the slowest, and a worker faster than the others may push twice into one merge,
where each of its pushes counts (the shard weighs each by the inner steps it covers: Shard.accumulate). A push
computed on weights more than `max_age` merges old is dropped as late (0: none is); the rest join the open merge
whatever their age. With `grace`, a merge that has its Q workers
stays open for more until the shard says its grace window is over (`expire`: psrv/server/pushes/grace.py
judges the window in seconds as requests arrive), or until every worker still pushing is in. With `wait`
(`--quorum-wait`), a whole push computed on the latest merge's weights (age 0, "fresh") holds its worker's pull
until the merge it joined closes, so that worker's next round starts from weights with its own push in them, and the
merge closes once Q distinct workers' fresh pushes are in: a push on older weights (a slower worker's) joins it
without counting, and is answered at once, as is one with no gradient. A worker waits for the Q-th fresh push, never
for the slowest; were older pushes counted, they would close merges before the fresh ones came, and every push would
be a merge old again.

Merges are per part: with streaming DiLoCo's fragments (`--fragments F`) each fragment of the shard has a merge of
its own, as in Decoupled DiLoCo, where the synchronizer's quorum is per fragment: fragment p's outer step happens
once Q workers' pushes of p are in, and a late push of p joins p's next merge, never another fragment's. `push`
names the part (the fragment's id, psrv/server/fragments.py `part_of`; None for whole pushes, the one part
there is) and selects its merge: the merge's state below (`arrived`, `gradients`, `due`) is the selected
part's, the others' parked (`_parked`) until a push or a `select` names them.

Its clocks are each worker's own count of pushes (async's); `open_clock` counts the merges, of every part."""
from collections import Counter
from dataclasses import dataclass

from psrv.server.consistency.base import Controller, Decision


class QuorumController(Controller):
    mode = "quorum"

    def __init__(self, num_workers: int, *, quorum: int, max_age: int = 0, grace: bool = False, wait: bool = False):
        if not 1 <= quorum <= num_workers:
            raise ValueError(f"quorum must be in [1, {num_workers}]; got {quorum}")
        if max_age < 0:
            raise ValueError(f"quorum max_age must be >= 0; got {max_age}")
        super().__init__(num_workers)
        self.quorum, self.max_age, self.grace, self.wait = quorum, max_age, grace, wait
        self.waiting: set[int] = set()  # with wait: the workers whose fresh whole push is in the open merge
        self.due = False  # with grace: the open merge's window is over
        self.open_clock = 0  # merges committed
        self.arrived: set[int] = set()  # distinct workers with a push in the selected open merge
        self.gradients: Counter = Counter()  # each one's pushes in it with a gradient (none for a non-finite one)
        # How many of `arrived` and of `gradients`' workers are still pushing, kept per push, leave, join and
        # finish: the merge's tests per push count instead of scanning every worker (_loaded_merge: from the sets)
        self._in_arrived = self._in_gradients = 0
        self.part: int | None = None  # the selected merge's part
        self._parked: dict[int | None, _Merge] = {}  # the other parts' open merges, their counts kept too

    def select(self, part: int | None) -> None:
        """Make `part`'s open merge the one the methods below look at (a new one, empty, where it has none)."""
        if part == self.part:
            return
        if self.arrived or self.due:
            self._parked[self.part] = _Merge(self.arrived, self.gradients, self.due, self._in_arrived,
                                             self._in_gradients)
        self._take(part)

    def _take(self, part: int | None) -> None:
        """`part`'s parked merge (a new one where it has none) becomes the selected one."""
        m = self._parked.pop(part, None) or _Merge(set(), Counter(), False, 0, 0)
        self.arrived, self.gradients, self.due, self._in_arrived, self._in_gradients = \
            m.arrived, m.gradients, m.due, m.in_arrived, m.in_gradients
        self.part = part

    def parts(self) -> list[int | None]:
        """The parts with an open merge (the selected one first), or the selected one alone."""
        return [self.part, *self._parked]

    def _pushing(self, worker: int) -> bool:
        return worker in self.active and worker not in self.finishing

    def _counted(self, worker: int, sign: int) -> None:
        """`worker` starts (+1) or stops (-1) pushing: its place in the open merges counts, or no longer."""
        self._in_arrived += sign * (worker in self.arrived)
        self._in_gradients += sign * (worker in self.gradients)
        for m in self._parked.values():
            m.in_arrived += sign * (worker in m.arrived)
            m.in_gradients += sign * (worker in m.gradients)

    def leave(self, worker: int) -> None:
        self.waiting.discard(worker)  # `waiting` holds workers still pushing only: met() counts it
        if self._pushing(worker):
            self._counted(worker, -1)
        super().leave(worker)

    def finish(self, worker: int) -> None:
        self.waiting.discard(worker)
        if self._pushing(worker):
            self._counted(worker, -1)
        super().finish(worker)

    def join(self, worker: int) -> None:
        was = self._pushing(worker)
        super().join(worker)
        if not was and self._pushing(worker):
            self._counted(worker, +1)

    def _decide(self, worker: int, clock: int, age: int) -> Decision:
        if self.max_age and age > self.max_age:
            return Decision.DROP
        pushing = self._pushing(worker)
        if worker not in self.arrived:
            self.arrived.add(worker)
            self._in_arrived += pushing
        if not self.gradients[worker]:
            self._in_gradients += pushing
        self.gradients[worker] += 1
        if self.wait and age == 0 and self.part is None and pushing:
            self.waiting.add(worker)
        return Decision.ACCUMULATE

    def needed(self) -> int:
        return max(1, min(self.quorum, self.pushing_count()))

    def commit_ready(self) -> bool:
        """Q distinct workers still pushing are in the open merge with a gradient, or every worker still
        pushing has pushed into it (the last merge, once the others finished or left)."""
        if not self.gradients:
            return False
        return self._in_arrived == self.pushing_count() or self.met() and (not self.grace or self.due)

    def met(self) -> bool:
        """Q distinct workers still pushing have a gradient in the open merge (its grace window may run); with
        wait, a fresh one, for a merge of whole pushes."""
        if self.wait and self.part is None:
            return len(self.waiting) >= self.needed()
        return self._in_gradients >= self.needed()

    def completes(self, worker: int) -> bool:
        """Whether a gradient of `worker` now would give the open merge its Q workers (the adaptive grace window
        is judged for that push before it is handled)."""
        return not self.met() and self._pushing(worker) and not self.gradients[worker] \
            and self._in_gradients + 1 >= self.needed()

    def expire(self) -> None:
        """The open merge's grace window is over: it closes once it has its Q workers."""
        self.due = True

    def void(self, worker: int) -> None:
        """The push just decided carried no gradient: it fills no quorum (its worker still arrived), and its
        pull waits for nothing."""
        self.waiting.discard(worker)
        self.gradients[worker] -= 1
        if self.gradients[worker] <= 0:
            del self.gradients[worker]
            self._in_gradients -= self._pushing(worker)

    def committed(self) -> None:
        """The selected part's merge closed: its next one is empty."""
        self.open_clock += 1
        if self.part is None:
            self.waiting = set()
        self.arrived, self.gradients, self.due = set(), Counter(), False
        self._in_arrived = self._in_gradients = 0

    def pull_ready(self, worker: int, clock: int) -> bool:
        return worker not in self.waiting

    def state_dict(self) -> dict:
        merges = {part: (m.arrived, m.gradients, m.due) for part, m in self._parked.items()}
        if self.arrived or self.due:  # whichever part is selected: a backup's state equals its primary's
            merges[self.part] = (self.arrived, self.gradients, self.due)
        return {**super().state_dict(), "open_clock": self.open_clock, "waiting": sorted(self.waiting),
                "merges": [[part, _merge_state(*merges[part])] for part in sorted(merges, key=repr)]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.open_clock = int(state["open_clock"])
        self.waiting = {int(w) for w in state.get("waiting", [])}
        # a state saved before merges were per part holds one, of part None
        merges = [[None, state]] if "merges" not in state else state["merges"]
        self._parked = {part: self._loaded_merge(merge) for part, merge in merges}
        self._take(None)

    def _loaded_merge(self, state: dict) -> "_Merge":
        arrived = {int(w) for w in state["arrived"]}
        gradients = Counter({int(w): int(n) for w, n in state["gradients"].items()})
        return _Merge(arrived, gradients, bool(state["due"]), sum(1 for w in arrived if self._pushing(w)),
                      sum(1 for w in gradients if self._pushing(w)))

    @property
    def voided(self) -> set[int]:
        """The workers in the open merge with no gradient in it (the history's commit lists the others)."""
        return self.arrived - self.gradients.keys()


def _merge_state(arrived: set[int], gradients: Counter, due: bool) -> dict:
    return {"arrived": sorted(arrived), "gradients": {int(w): int(n) for w, n in gradients.items()}, "due": due}


@dataclass(slots=True)
class _Merge:
    """A parked part's open merge: as the selected one's attributes, with its counts of workers still pushing."""
    arrived: set[int]
    gradients: Counter
    due: bool
    in_arrived: int
    in_gradients: int
