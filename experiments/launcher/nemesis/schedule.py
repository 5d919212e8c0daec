"""A run's nemesis schedule as faults in time: the fixed clauses as given, the random ones drawn from their seed,
and every `*` target drawn too, so one schedule and one seed give the same faults in the same order every time."""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Iterator

from psrv.config.nemesis import TIMED, At, Drawn, Fixed, Target, fits, parse_schedule


@dataclass(frozen=True)
class Planned:
    """One fault to do: `kind` on `targets` (each `*` drawn already; which of shard K's backups `backup:K` means
    is chosen when it is done, among those alive then), due `at`, lasting `duration` seconds, from clause `clause`."""

    kind: str
    targets: tuple[Target, ...]
    at: At
    duration: float
    clause: int

    @property
    def target(self) -> str:
        """'primary:0', 'worker:1/backup:0' (a partition), '' (disk_full)."""
        return "/".join(str(t) for t in self.targets)

    def __str__(self) -> str:
        return " ".join(filter(None, (self.kind, self.target, f"at {self.at}",
                                      f"for {self.duration:g}s" if self.duration else "")))


def resolve(target: Target, rng: random.Random, *, servers: int, workers: int) -> Target:
    """`target` with a `*` index drawn: a shard in 0..servers-1, a rank in 1..workers-1 (never rank 0)."""
    if target.index is not None or target.role == "launcher":
        return target
    if target.role == "worker":
        return Target("worker", rng.randrange(1, workers))
    return Target(target.role, rng.randrange(servers))


def draws(clause: Drawn, index: int, *, seed: int, servers: int, workers: int) -> Iterator[Planned]:
    """Clause `index`'s faults, endless and in time order: intervals exponential with mean `every` (or exactly
    `every`), then a kind, then its targets (a partition: two different entries of the list), each drawn from
    a generator of its own seeded with (seed, index)."""
    rng = random.Random(f"psrv-nemesis:{seed}:{index}")
    at = 0.0
    while True:
        at += rng.expovariate(1 / clause.every) if clause.law == "exp" else clause.every
        kind = rng.choice(clause.kinds)
        usable = [t for t in clause.targets if fits(kind, t)]
        chosen = () if kind == "disk_full" else tuple(rng.sample(usable, 2)) if kind == "partition" \
            else (rng.choice(usable),)
        targets = tuple(resolve(t, rng, servers=servers, workers=workers) for t in chosen)
        yield Planned(kind, targets, At(seconds=round(at, 3)), clause.duration if kind in TIMED else 0.0, index)


def _due(at: At, seconds: float | None, step: int) -> bool:
    return step >= at.step if at.step is not None else seconds is not None and seconds >= at.seconds


class Timeline:
    """The schedule `text`'s faults, handed out as they fall due (`due`); a random clause without `seed S`
    draws from `seed` (the run's)."""

    def __init__(self, text: str, *, seed: int, servers: int, workers: int):
        clauses = parse_schedule(text)
        rng = random.Random(f"psrv-nemesis:{seed}:fixed")
        self.fixed = [Planned(c.kind, tuple(resolve(t, rng, servers=servers, workers=workers) for t in c.targets),
                              c.at, c.duration, i) for i, c in enumerate(clauses) if isinstance(c, Fixed)]
        self.streams = [draws(c, i, seed=seed if c.seed is None else c.seed, servers=servers, workers=workers)
                        for i, c in enumerate(clauses) if isinstance(c, Drawn)]
        self.heads = [next(s) for s in self.streams]

    def due(self, *, seconds: float | None, step: int) -> list[Planned]:
        """The faults due now, in the order of their times, each handed out once: `seconds` since worker 0's
        first step (None before it), `step` its steps."""
        out = [p for p in self.fixed if _due(p.at, seconds, step)]
        self.fixed = [p for p in self.fixed if p not in out]
        for i, stream in enumerate(self.streams):
            while _due(self.heads[i].at, seconds, step):
                out.append(self.heads[i])
                self.heads[i] = next(stream)
        return sorted(out, key=lambda p: (p.at.seconds if p.at.seconds is not None else -1.0, p.clause))

    def in_time_order(self) -> Iterator[Planned]:
        """Every fault still to come, in the order of its seconds (as `due` hands them out), endless where a
        clause draws: for the simulator, whose clock is its own. ValueError for a fault due at a step."""
        at_step = [p for p in self.fixed if p.at.step is not None]
        if at_step:
            raise ValueError(f"{at_step[0]}: a fault at a step of worker 0's is not simulated; give its time in "
                             "seconds ('at 30s')")
        heads = [(p.at.seconds, p.clause, -1, p) for p in self.fixed]
        heads += [(p.at.seconds, p.clause, i, p) for i, p in enumerate(self.heads)]
        heapq.heapify(heads)
        while heads:
            _, clause, i, planned = heapq.heappop(heads)
            yield planned
            if i >= 0:
                nxt = next(self.streams[i])
                heapq.heappush(heads, (nxt.at.seconds, nxt.clause, i, nxt))
