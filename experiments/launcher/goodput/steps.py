"""A run's worker steps as its histories tell them (docs/history.md): each push a worker sent, named (rank, seq),
with whether every shard's final lineage applied it, once or more, when, and what became of one that was not."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from psrv.experiments.launcher.history.lineage import shard_histories
from psrv.experiments.launcher.history.reading import ProcessLog, read_history


@dataclass
class Step:
    """One step's push of a worker (rank `w`, `seq`), sent by the life whose history file is `life`, to each of
    the run's `servers` shards (or to those it reached before it died)."""
    w: int
    seq: int
    life: str
    servers: int
    clock: dict[int, int] = field(default_factory=dict)     # shard -> the push's clock there
    acked: set[int] = field(default_factory=set)            # shards whose answer the worker took, not dropped
    dropped: set[int] = field(default_factory=set)          # shards that took it and dropped it (ack or lineage)
    applied: dict[int, int] = field(default_factory=dict)   # shard -> `apply` events in its final lineage
    done_t: float | None = None                             # the last of those applies (time.monotonic())

    @property
    def useful(self) -> bool:
        """Applied in the final lineage of every shard of the run: its whole gradient is in the final weights."""
        return all(self.applied.get(k, 0) for k in range(self.servers))

    @property
    def twice(self) -> bool:
        """Applied more than once in some shard's final lineage (the checker's rule 1 says it never is)."""
        return any(n > 1 for n in self.applied.values())

    def loss(self) -> str | None:
        """Why a step that is not useful is lost: 'acknowledged' (a shard said it was applied, and the final
        lineage lacks it: a rule-1 violation), 'dropped' (a shard took it and dropped it: late, non-finite), or
        'unacknowledged' (no answer came: the worker or the replica holding it died first); None if useful."""
        if self.useful:
            return None
        missing = [k for k in range(self.servers) if not self.applied.get(k, 0)]
        if any(k in self.acked and k not in self.dropped for k in missing):
            return "acknowledged"
        return "dropped" if any(k in self.dropped for k in missing) else "unacknowledged"


@dataclass
class RunSteps:
    """Every step of a run, and the times of the shards' `member` events that end a rank's run."""
    steps: dict[tuple[int, int], Step]
    lives: dict[int, list[str]]                 # rank -> its history files, oldest life first
    started: float | None                       # the first push of any worker
    finished: dict[int, float]                  # rank -> the first leave or finish of it in a final lineage

    def redone(self) -> list[Step]:
        """Steps a later life of a rank sent for a clock that an earlier life's push had applied on that shard: work
        a restarted worker did again (in async and ssp a rejoiner resumes its own clock, so normally none)."""
        applied: dict[tuple[int, int, str], set[int]] = {}  # (rank, shard, life) -> clocks applied
        for s in self.steps.values():
            for k, c in s.clock.items():
                if s.applied.get(k, 0):
                    applied.setdefault((s.w, k, s.life), set()).add(c)
        again = []
        for s in self.steps.values():
            earlier = self.lives[s.w][:self.lives[s.w].index(s.life)]
            if any(c in applied.get((s.w, k, life), ()) for k, c in s.clock.items() for life in earlier):
                again.append(s)
        return again


def _worker_events(logs: list[ProcessLog], steps: dict[tuple[int, int], Step], servers: int) -> float | None:
    started = None
    for log in logs:
        for e in log.events:
            if e.ev == "push":
                s = steps.setdefault((e["w"], e["seq"]), Step(e["w"], e["seq"], log.file, servers))
                s.clock[e["shard"]] = e["clock"]
                started = e.t if started is None else min(started, e.t)
            elif e.ev == "ack" and (e["w"], e["seq"]) in steps:
                s = steps[(e["w"], e["seq"])]
                (s.acked if e["dropped"] is None else s.dropped).add(e["shard"])
    return started


def read_steps(run: Path, servers: int) -> RunSteps:
    """The steps of run folder `run` (DIR/history) with `servers` shards; HistoryError (a ValueError) if the
    history cannot be read (docs/history.md, `psrv check`)."""
    logs = read_history(run / "history")
    workers = sorted((log for log in logs if log.is_worker), key=lambda log: log.started)
    steps: dict[tuple[int, int], Step] = {}
    started = _worker_events(workers, steps, servers)
    finished: dict[int, float] = {}
    for k, history in shard_histories(logs, servers).items():
        for e in history.lineage():
            if e.ev == "apply" and (e["w"], e["seq"]) in steps:
                s = steps[(e["w"], e["seq"])]
                s.applied[k] = s.applied.get(k, 0) + 1
                s.done_t = e.t if s.done_t is None else max(s.done_t, e.t)
            elif e.ev == "drop" and (e["w"], e["seq"]) in steps:
                steps[(e["w"], e["seq"])].dropped.add(k)
            elif e.ev == "member" and e["what"] in ("leave", "finish"):
                finished[e["w"]] = min(finished.get(e["w"], e.t), e.t)
    lives: dict[int, list[str]] = {}
    for log in workers:
        lives.setdefault(log.rank, []).append(log.file)
    return RunSteps(steps, lives, started, finished)
