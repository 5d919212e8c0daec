"""BSP: gradients of clock c are buffered; when every active worker's (or N-b with backup
workers) is in, the shard applies their mean as ONE step and pulls for c+1 are answered. A worker that
(re)joins while others push the open clock counts from the clock after it (`joining`), so they never wait
for its start-up and first round."""
from psrv.server.consistency.base import Controller, Decision


class SyncController(Controller):
    mode = "sync"

    def __init__(self, num_workers: int, *, backup_workers: int = 0):
        if not 0 <= backup_workers < num_workers:
            raise ValueError(f"backup_workers must be in [0, {num_workers}); got {backup_workers}")
        super().__init__(num_workers)
        self.backup_workers = backup_workers
        self.open_clock = 0           # the clock being collected; == updates applied unless resumed
        self.arrived: set[int] = set()
        self.voided: set[int] = set()  # arrived with no gradient (non-finite, skipped): not in the quorum
        self.resumed = False          # restored from a checkpoint: workers may be ahead of us
        self.skipped = 0              # clocks lost to a restore (their updates are gone)
        self.joining: dict[int, int] = {}  # a (re)joined worker -> the first clock the barrier waits for it, > open

    def _decide(self, worker: int, clock: int, age: int) -> Decision:
        if clock != self.open_clock or worker in self.arrived:
            return Decision.DROP
        self.arrived.add(worker)
        return Decision.ACCUMULATE

    def join(self, worker: int) -> None:
        """`worker` (re)joins: while others push the open clock it counts from the clock after it, whose
        weights (the open clock's commit) it pulls first, so its start-up never holds them; alone, at once."""
        self.joining.pop(worker, None)
        super().join(worker)
        if self.pushing_count() > 1:  # another worker still pushes (this one does, being active and not joining)
            self.joining[worker] = self.open_clock + 1

    def leave(self, worker: int) -> None:
        self.joining.pop(worker, None)
        super().leave(worker)

    def expect(self, worker: int, clock: int) -> None:
        """`worker` pulls for `clock`, the first it will push: a joiner counts from there (another shard
        may have welcomed it a clock later than this one), so no shard waits for a clock it skips."""
        if worker in self.joining and clock > self.joining[worker]:
            self.joining[worker] = clock

    def counted_from(self, worker: int) -> int | None:
        return self.joining.get(worker)

    def pushing(self) -> set[int]:
        """The workers the open clock's barrier waits for: active, not finished, not joining a later clock."""
        return super().pushing() - self.joining.keys()

    def pushing_count(self) -> int:
        """len(pushing()): the joiners count out, but those finishing too are out already; joiners are active
        (join adds them once active, leave drops them, a load keeps the active ones). O(the smaller of the two)."""
        small, big = sorted((self.joining.keys(), self.finishing), key=len)
        return super().pushing_count() - len(self.joining) + sum(1 for w in small if w in big)

    def needed(self) -> int:
        return max(1, self.pushing_count() - self.backup_workers)

    def commit_ready(self) -> bool:
        # A worker that pushed this clock and then left (or finished) keeps its gradient in the sum,
        # but only the workers still pushing count toward the quorum: its leaving must not close the
        # clock before the others' gradients of it are in.
        # A voided push (non-finite, skipped) is no gradient: it never fills a backup quorum, but its
        # worker is done with the clock, so it never holds the clock either.
        if not self.arrived:  # no gradient: only a clock no one is left to push, a joiner waiting past it, ends
            return bool(self.joining) and not self.pushing()
        need = self.needed()
        if len(self.arrived) < need:  # fewer in than the quorum, and than every worker still pushing:
            return False  # neither test below can pass (each push's test costs no scan of every worker)
        pushing = self.pushing()
        return len((self.arrived - self.voided) & pushing) >= need or pushing <= self.arrived

    def void(self, worker: int) -> None:
        self.voided.add(worker)

    def committed(self) -> None:
        self.open_clock += 1
        self.arrived = set()
        self.voided = set()
        self.joining = {w: c for w, c in self.joining.items() if c > self.open_clock}  # the rest count now

    def pull_ready(self, worker: int, clock: int) -> bool:
        return clock <= self.open_clock

    def next_clock(self, worker: int) -> int:
        return self.joining.get(worker, self.open_clock)

    def catch_up(self, clock: int) -> int:
        # Only a shard restored from a checkpoint can see a clock it never opened: the others
        # committed clocks this one lost. Jump to it so the barrier meets the workers again.
        if not self.resumed or clock <= self.open_clock:
            return 0
        skipped, self.open_clock, self.arrived, self.voided = clock - self.open_clock, clock, set(), set()
        self.joining = {w: c for w, c in self.joining.items() if c > self.open_clock}
        self.skipped += skipped
        return skipped

    def state_dict(self) -> dict:
        return {**super().state_dict(), "open_clock": self.open_clock, "arrived": sorted(self.arrived),
                "voided": sorted(self.voided), "skipped": self.skipped,
                "joining": {int(w): int(c) for w, c in self.joining.items()}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.open_clock = int(state["open_clock"])
        self.arrived = {int(w) for w in state["arrived"]}
        self.voided = {int(w) for w in state.get("voided", [])}
        self.skipped = int(state.get("skipped", 0))
        self.joining = {int(w): int(c) for w, c in state.get("joining", {}).items() if int(w) in self.active}
        self.resumed = True
