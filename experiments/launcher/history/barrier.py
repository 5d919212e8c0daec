"""Rule 3, the sync barrier: each `commit` holds exactly the pushes accumulated for its clock, as many of the
workers still pushing as `need` says (fewer only once every one of them is in), and each clock commits once.
Under `--quorum Q` (psrv/server/consistency/quorum.py) a commit is a merge of the pushes accumulated since the
last one, of any clocks and a worker's more than one: Q distinct workers still pushing (fewer only once every
one of them is in; with `--quorum-grace`, more once its window is over, `due`), and no push older than
`--quorum-max-age` merges. With streaming DiLoCo's fragments each fragment has merges of its own: a push and a
commit name the fragment's `part`, and a commit merges the pushes of its part alone. With `--quorum-wait` a merge of
whole pushes counts the fresh ones only (age 0), and a fresh push's pull is answered after its merge: at a version
past the one it was accumulated at."""
from __future__ import annotations

from psrv.experiments.launcher.history.reading import Event
from psrv.experiments.launcher.history.replay import VOID_DROPS, Membership
from psrv.experiments.launcher.history.result import Violation


def _names(workers) -> str:
    return "{" + ", ".join(map(str, sorted(workers))) + "}"


class Barrier:
    """One lineage replayed: the pushes accumulated since the last commit and the clocks committed."""

    def __init__(self, shard: int, workers: int, backup_workers: int):
        self.shard, self.backup_workers = shard, backup_workers
        self.members = Membership(workers)
        self.accumulated: list[Event] = []   # `apply` events since the last commit
        self.voided: dict[int, set[int]] = {}  # clock -> workers whose push came with no gradient (VOID_DROPS)
        self.committed: dict[int, Event] = {}
        self.commits = 0
        self.found: list[Violation] = []

    def see(self, e: Event) -> None:
        self.members.see(e)
        if e.ev == "apply":
            self.accumulated.append(e)
        elif e.ev == "drop" and e["why"] in VOID_DROPS:
            self.voided.setdefault(e["clock"], set()).add(e["w"])
        elif e.ev == "commit":
            self._commit(e)
            self.members.committed(e["clock"])
            self.accumulated, self.voided = [], {}

    def _flag(self, e: Event, message: str) -> None:
        self.found.append(Violation.at(3, e, f"shard {self.shard}: {message}"))

    def _members_said(self, e: Event, what: str) -> set[int]:
        """The workers still pushing, from the lineage's `member` events; flagged where commit `e` says other
        active or pushing workers than those (a replica whose controller lost a worker's leave or finish)."""
        m = self.members
        pushing = m.pushing()
        for key, rebuilt in (("active", m.active), ("pushing", pushing)):  # where the commit says them
            if key in e.fields and set(e[key]) != rebuilt:
                self._flag(e, f"{what} says {_names(e[key])} are {key}, but the lineage's `member` events make "
                           f"them {_names(rebuilt)}")
        return pushing

    def _once(self, e: Event, what: str) -> None:
        """Count commit `e`; flagged where its clock (`what`: "clock" or, under a quorum, "merge") committed before."""
        c = e["clock"]
        self.commits += 1
        if c in self.committed:
            self._flag(e, f"{what} {c} commits a second time (first at {self.committed[c].where})")
        self.committed.setdefault(c, e)

    def _commit(self, e: Event) -> None:
        c, need = e["clock"], e["need"]
        self._once(e, "clock")
        held: dict[int, Event] = {}
        for a in self.accumulated:
            if a["clock"] != c:
                self._flag(a, f"worker {a['w']}'s push for clock {a['clock']} was accumulated while clock {c} was "
                           f"open (it commits at {e.where})")
            elif a["w"] in held:
                self._flag(a, f"worker {a['w']}'s gradient goes into clock {c} twice (first at "
                           f"{held[a['w']].where})")
            else:
                held[a["w"]] = a
        pushers = set(held)
        if set(e["pushed"]) != pushers:
            self._flag(e, f"the commit of clock {c} lists workers {_names(e['pushed'])}, but the lineage "
                       f"accumulated the pushes of {_names(pushers)} for it")
        pushing = self._members_said(e, f"the commit of clock {c}")
        expect = max(1, len(pushing) - self.backup_workers)
        if need != expect:
            self._flag(e, f"the commit of clock {c} waited for {need} pushes, but with {_names(pushing)} still "
                       f"pushing and backup_workers {self.backup_workers} it needs {expect}")
        counted = len(pushers & pushing)
        everyone = pushing <= pushers | self.voided.get(c, set())
        if counted > need or (counted < need and not everyone):
            missing = pushing - pushers - self.voided.get(c, set())
            self._flag(e, f"the commit of clock {c} holds the pushes of {counted} workers still pushing "
                       f"({_names(pushers & pushing)}) and needs exactly {need}"
                       + (f"; {_names(missing)} had not pushed it" if counted < need else ""))


class Merges(Barrier):
    """Rule 3 under a quorum: each commit merges whatever its part accumulated since the part's last one."""

    def __init__(self, shard: int, workers: int, quorum: int, max_age: int, grace: bool, wait: bool = False):
        super().__init__(shard, workers, 0)
        self.quorum, self.max_age, self.grace, self.wait = quorum, max_age, grace, wait
        self.held: dict[tuple[int, int], Event] = {}  # with wait: (worker, seq) -> its fresh whole push's `apply`
        self.version: int | None = None  # after the lineage's last merge (None before one, and after a state load)
        self.parts: dict = {}  # part -> its `apply` events since its last merge (a whole push's part: None)
        self.voided_in: dict = {}  # part -> workers whose push to it came with no gradient (VOID_DROPS)

    def see(self, e: Event) -> None:
        part = e.fields.get("part")
        if e.ev == "drop" and e["why"] in VOID_DROPS:  # a merge's voided pushes, whatever their clock
            self.members.see(e)
            self.voided_in.setdefault(part, set()).add(e["w"])
            return
        if e.ev == "state":  # a state taken whole (a backup joining): its version is the primary's
            self.version = None
        if e.ev == "apply":
            self.members.see(e)
            self.parts.setdefault(part, []).append(e)
            if self.wait and part is None and e.fields.get("age") == 0:
                self.held[(e["w"], e["seq"])] = e
            return
        if e.ev == "answer" and self.wait:
            self._answered(e)
        if e.ev == "commit":  # the merge of its part: the pushes accumulated there
            self.accumulated, self.voided = self.parts.pop(part, []), {-1: self.voided_in.pop(part, set())}
        super().see(e)

    def _commit(self, e: Event) -> None:
        c, need = e["clock"], e["need"]
        self._once(e, "merge")
        # only merges step a quorum's shard: each moves the version by one (a history from before merges were
        # per fragment says `updates` where one stepped several)
        steps = e.fields.get("updates", 1) if e["pushed"] else 0
        if self.version is not None and e["version"] != self.version + steps:
            self._flag(e, f"merge {c} moved the version from {self.version} to {e['version']}, but it took {steps} "
                       f"step{'s' if steps != 1 else ''}")
        self.version = e["version"]
        pushers = {a["w"] for a in self.accumulated}
        for a in self.accumulated:
            age = a.fields.get("age")
            if self.max_age and age is not None and age > self.max_age:
                self._flag(a, f"worker {a['w']}'s push {age} merges old went into merge {c}; --quorum-max-age "
                           f"{self.max_age} drops it")
        if set(e["pushed"]) != pushers:
            self._flag(e, f"merge {c} lists workers {_names(e['pushed'])}, but the lineage accumulated the pushes "
                       f"of {_names(pushers)} for it")
        pushing = self._members_said(e, f"merge {c}")
        expect = max(1, min(self.quorum, len(pushing)))
        if need != expect:
            self._flag(e, f"merge {c} waited for {need} workers, but with {_names(pushing)} still pushing and "
                       f"quorum {self.quorum} it needs {expect}")
        counted = len(pushers & pushing)
        if self.wait and e.fields.get("part") is None:  # the fresh pushes fill it; older ones join it uncounted
            counted = len({a["w"] for a in self.accumulated if a.fields.get("age") == 0} & pushing)
        everyone = pushing <= pushers | self.voided.get(-1, set())
        if self.grace:  # it waits past its Q workers for more until its window is over (`due`) or all are in
            if not everyone and (counted < need or not e.fields.get("due")):
                self._flag(e, f"merge {c} holds the pushes of {counted} workers still pushing "
                           f"({_names(pushers & pushing)}) of {len(pushing)}, with its grace window "
                           + ("over" if e.fields.get("due") else "not over") + f", and needs {need}")
        elif counted > need or (counted < need and not everyone):
            self._flag(e, f"merge {c} holds the pushes of {counted} workers still pushing "
                       f"({_names(pushers & pushing)}) and needs exactly {need}")


    def _answered(self, e: Event) -> None:
        """With wait: the answer to a fresh whole push's pull comes from a version its merge made."""
        a = self.held.pop((e["w"], e["seq"]), None)
        if a is not None and a.fields.get("version") is not None and e["version"] <= a["version"]:
            self._flag(e, f"worker {e['w']}'s pull after its fresh push seq {e['seq']} was answered at version "
                       f"{e['version']}, before the merge of that push (accumulated at version {a['version']}); "
                       "--quorum-wait holds it until then")


def check(shard: int, lineage: list[Event], *, workers: int, backup_workers: int, quorum: int = 0,
          quorum_max_age: int = 0, quorum_grace: float = 0.0, quorum_wait: bool = False) -> tuple[list[Violation], int]:
    """Rule 3's violations in one lineage, and its commits."""
    barrier = (Merges(shard, workers, quorum, quorum_max_age, quorum_grace > 0, quorum_wait) if quorum
               else Barrier(shard, workers, backup_workers))
    for e in lineage:
        barrier.see(e)
    return barrier.found, barrier.commits
