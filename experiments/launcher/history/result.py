"""What `psrv check` found: the violations, each the event that breaks a rule of docs/history.md, or the
counts a clean history was checked on; as data (summary.json can hold it) and as one line for a person."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from psrv.experiments.launcher.history.reading import Event

RULES = {1: "nothing lost, nothing twice", 2: "no split brain", 3: "the sync barrier", 4: "the ssp bound",
         5: "the counts"}


@dataclass(frozen=True)
class Violation:
    """Rule `rule` broken at line `line` of `file` (a history file; summary.json or server-K.json for rule 5,
    with no line), by `event`, as `message` says."""
    rule: int
    file: str
    line: int | None
    message: str
    event: dict | None = None
    t: float = math.inf  # when: the first violation in time is the one reported

    @classmethod
    def at(cls, rule: int, event: Event, message: str) -> Violation:
        return cls(rule, event.file, event.line, message, event.fields, event.t)

    def sort_key(self) -> tuple:
        return self.t, self.file, self.line or 0, self.rule

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        shown = f" [{', '.join(f'{k}={v}' for k, v in self.event.items())}]" if self.event else ""
        return f"{where}: rule {self.rule} ({RULES[self.rule]}): {self.message}{shown}"


@dataclass(frozen=True)
class Counts:
    """What a history held, counted as it was checked."""
    acknowledged: int = 0  # pushes workers took an answer for that did not say dropped
    applied: int = 0       # `apply` events in the shards' final lineages
    replicas: int = 0      # replica lives (history files of shards)
    epochs: int = 0        # (shard, epoch) pairs some replica served as primary
    commits: int = 0       # sync: `commit` events in the final lineages
    answered: int = 0      # pulls answered (`answer` events, every replica's)

    def __str__(self) -> str:
        return (f"{self.acknowledged} acknowledged pushes, {self.applied} applied, {self.replicas} replicas, "
                f"{self.epochs} epochs, {self.commits} commits, {self.answered} answered pulls")


@dataclass(frozen=True)
class CheckResult:
    """`psrv check`'s verdict on one run folder: `violations`, first in time first (empty: clean)."""
    run: str
    mode: str
    counts: Counts
    violations: list[Violation] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # comparisons the run's records did not allow, and why

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        """One line: the first violation and how many more, or what a clean history held."""
        if self.ok:
            return f"{self.run}: clean ({self.mode}, rules 1-5): {self.counts}"
        more = len(self.violations) - 1
        return f"{self.run}: {str(self.violations[0])}" + (f" (and {more} more)" if more else "")

    def to_dict(self) -> dict:
        """For summary.json: ok, the counts, every violation as a line, and what was skipped."""
        return {"ok": self.ok, "counts": dataclasses.asdict(self.counts),
                "violations": [str(v) for v in self.violations], "skipped": list(self.skipped)}
