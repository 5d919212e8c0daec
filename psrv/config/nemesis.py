"""The nemesis's settings (`psrv run --nemesis SPEC`, spec table [nemesis]) and the text form of its schedule:
faults at given times and faults drawn at random, parsed and checked here; experiments/launcher/nemesis does them."""
from __future__ import annotations

import re
from dataclasses import dataclass

from psrv.config.base import ConfigError, Section, setting

KINDS = ("kill", "pause", "partition", "late_ack", "disk_full")
ROLES = ("primary", "backup", "worker", "launcher")
TIMED = ("pause", "partition", "late_ack", "disk_full")  # the kinds that last (`for D`); a kill does not
LAWS = ("exp", "fixed")  # a random clause's intervals: exponential with mean T, or T each
FORM = ("'KIND TARGET at (step N | Ns) [for Ds]' or 'every Ts [exp|fixed] KIND[,KIND...] on TARGET[,TARGET...] "
        "[for Ds] [seed S]', clauses joined by ';' (KIND: kill, pause, partition, late_ack, disk_full; TARGET: "
        "primary:K, backup:K, worker:R, launcher, K or R may be *; partition: TARGET/TARGET; disk_full: no "
        "TARGET), e.g. 'pause primary:0 at step 40 for 2.5s; kill backup:0 at 12s'")
_TIME = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s)")


@dataclass(frozen=True)
class Target:
    """A process by its role: shard K's current primary or one of its backups, rank R's worker, or the
    launcher itself; `index` None: any one (`*`), drawn from the schedule's seed (a worker: never rank 0)."""

    role: str
    index: int | None = None

    def __str__(self) -> str:
        return self.role if self.role == "launcher" else f"{self.role}:{'*' if self.index is None else self.index}"


@dataclass(frozen=True)
class At:
    """When a fault is due: once worker 0 has done `step` steps, or `seconds` after its first step."""

    step: int | None = None
    seconds: float | None = None

    def __str__(self) -> str:
        return f"step {self.step}" if self.step is not None else f"{self.seconds:g}s"


@dataclass(frozen=True)
class Fixed:
    """One fault at a given time: `kind` on `targets` (two for a partition, none for disk_full)."""

    kind: str
    targets: tuple[Target, ...]
    at: At
    duration: float = 0.0


@dataclass(frozen=True)
class Drawn:
    """A fault every `every` seconds (exponential intervals of that mean, or exactly that), each of a kind drawn
    from `kinds` on targets drawn from `targets` (a partition: two different ones), from `seed` (None: the run's)."""

    every: float
    law: str
    kinds: tuple[str, ...]
    targets: tuple[Target, ...]
    duration: float = 0.0
    seed: int | None = None


def fits(kind: str, target: Target) -> bool:
    """Whether a fault of `kind` can be done to `target`: the launcher is only paused, a late ack is a backup's."""
    if kind == "late_ack":
        return target.role == "backup"
    return kind == "pause" or target.role != "launcher"


def parse_schedule(text: str) -> tuple[Fixed | Drawn, ...]:
    """The clauses of a schedule ('' : none); ValueError naming the clause, what is wrong and the form."""
    clauses = []
    for clause in (c.strip() for c in text.split(";")):
        if not clause:
            continue
        try:
            clauses.append(_drawn(clause.split()) if clause.split()[0] == "every" else _fixed(clause.split()))
        except ValueError as exc:
            raise ValueError(f"{exc} in {clause!r}; a clause looks like {FORM}") from None
    if text.strip() and not clauses:
        raise ValueError(f"no clause in {text!r}; a clause looks like {FORM}")
    return tuple(clauses)


def _fixed(words: list[str]) -> Fixed:
    kind = _kind(words[0])
    at = words.index("at") if "at" in words else -1
    if at < 0:
        raise ValueError("no 'at'")
    named = words[1:at]
    if len(named) > 1:
        raise ValueError(f"one TARGET before 'at', got {' '.join(named)!r}")
    targets = tuple(_target(t) for t in named[0].split("/")) if named else ()
    when, rest = _when(words[at + 1:])
    duration, rest = _option(rest, "for", _seconds)
    if rest:
        raise ValueError(f"unexpected {' '.join(rest)!r}")
    want = 0 if kind == "disk_full" else 2 if kind == "partition" else 1
    if len(targets) != want:
        raise ValueError(f"{kind} takes {('no TARGET', 'one TARGET', 'TARGET/TARGET')[want]}")
    if kind == "partition" and targets[0] == targets[1]:
        raise ValueError("a partition cuts two different processes")
    for t in targets:
        if not fits(kind, t):
            raise ValueError(f"{kind} cannot be done to {t}" + (" (the launcher is only paused)"
                                                               if t.role == "launcher" else " (only to a backup)"))
    return Fixed(kind, targets, when, _duration(kind in TIMED, duration, kind))


def _drawn(words: list[str]) -> Drawn:
    if len(words) < 3:
        raise ValueError("too short")
    every = _seconds(words[1])
    if every <= 0:
        raise ValueError("'every' takes a time > 0")
    rest = words[2:]
    law = rest.pop(0) if rest[0] in LAWS else "exp"
    if not rest:
        raise ValueError("no KIND")
    kinds = tuple(_kind(k) for k in rest.pop(0).split(","))
    targets: tuple[Target, ...] = ()
    if rest and rest[0] == "on":
        if len(rest) < 2:
            raise ValueError("no TARGET after 'on'")
        targets = tuple(_target(t) for t in rest[1].split(","))
        rest = rest[2:]
    duration, rest = _option(rest, "for", _seconds)
    seed, rest = _option(rest, "seed", _seed)
    if rest:
        raise ValueError(f"unexpected {' '.join(rest)!r}")
    for kind in kinds:
        usable = [t for t in targets if fits(kind, t)]
        if kind == "partition" and len(usable) < 2:
            raise ValueError("partition draws two different targets: list two or more that are not the launcher")
        if kind not in ("disk_full", "partition") and not usable:
            raise ValueError(f"{kind} has no TARGET it can be done to" +
                             (" (a backup:K)" if kind == "late_ack" else ""))
    for t in targets:
        if not any(fits(k, t) for k in kinds if k != "disk_full"):
            raise ValueError(f"no KIND listed can be done to {t}")
    return Drawn(every, law, kinds, targets, _duration(any(k in TIMED for k in kinds), duration, "/".join(kinds)),
                 seed)


def _kind(word: str) -> str:
    if word not in KINDS:
        raise ValueError(f"unknown KIND {word!r}")
    return word


def _target(word: str) -> Target:
    if word == "launcher":
        return Target("launcher")
    role, _, index = word.partition(":")
    if role not in ROLES[:3] or not (index == "*" or index.isdigit()):
        raise ValueError(f"unknown TARGET {word!r}")
    return Target(role, None if index == "*" else int(index))


def _seconds(word: str) -> float:
    match = _TIME.fullmatch(word)
    if match is None:
        raise ValueError(f"a time looks like 12s, 2.5s or 500ms, not {word!r}")
    return float(match[1]) / (1000 if match[2] == "ms" else 1)


def _seed(word: str) -> int:
    if not word.isdigit():
        raise ValueError(f"a seed is an integer >= 0, not {word!r}")
    return int(word)


def _when(words: list[str]) -> tuple[At, list[str]]:
    if words[:1] == ["step"] and len(words) > 1:
        if not words[1].isdigit() or int(words[1]) < 1:
            raise ValueError(f"a step is an integer >= 1, not {words[1]!r}")
        return At(step=int(words[1])), words[2:]
    if not words:
        raise ValueError("no time after 'at'")
    return At(seconds=_seconds(words[0])), words[1:]


def _option(words: list[str], name: str, parse) -> tuple:
    if words[:1] != [name]:
        return None, words
    if len(words) < 2:
        raise ValueError(f"nothing after {name!r}")
    return parse(words[1]), words[2:]


def _duration(timed: bool, duration: float | None, kind: str) -> float:
    if timed and not duration:
        raise ValueError(f"{kind} lasts: add 'for Ds' (D > 0)")
    if not timed and duration is not None:
        raise ValueError("a kill does not last: remove 'for'")
    return duration or 0.0


def kinds_of(text: str) -> set[str]:
    """Every kind a schedule can do."""
    return {k for c in parse_schedule(text) for k in ((c.kind,) if isinstance(c, Fixed) else c.kinds)}


def _schedule(text: str) -> None:
    parse_schedule(text)


@dataclass(frozen=True, kw_only=True)
class NemesisSettings(Section):
    """Faults psrv run makes on a schedule, seeded and recorded in DIR/nemesis.jsonl (experiments/launcher/nemesis)."""

    schedule: str = setting("", "faults on a schedule: 'KIND TARGET at (step N | Ns) [for Ds]' or 'every Ts "
                            "[exp|fixed] KIND[,KIND...] on TARGET[,TARGET...] [for Ds] [seed S]', clauses joined by "
                            "';'; KIND: kill, pause, partition (needs root), late_ack, disk_full (needs root); "
                            "TARGET: primary:K, backup:K, worker:R, launcher; time from worker 0's first step "
                            "(docs/reliability.md, 'The nemesis'); '' : none", flag="nemesis", metavar="SPEC",
                            check=_schedule)
    disk_mb: int = setting(256, "with disk_full in the schedule: the size of the tmpfs mounted at DIR/checkpoints, "
                           "in MiB, which disk_full fills", minimum=1, flag="nemesis-disk-mb", metavar="MIB")


def check_nemesis(run) -> None:
    """What the run must have for its schedule (RunConfig.validate): its targets exist, a worker kill spares
    rank 0, a late ack has backups, disk_full has checkpoints to fill, a partition runs on zmq."""
    kinds, targets = set(), []
    for c in parse_schedule(run.nemesis.schedule):
        kinds |= {c.kind} if isinstance(c, Fixed) else set(c.kinds)
        targets += [(c.kind if isinstance(c, Fixed) else None, t) for t in c.targets]
    if not kinds:
        if run.nemesis.disk_mb != NemesisSettings.disk_mb:
            raise ConfigError("nemesis.disk_mb", "sizes the tmpfs disk_full fills; the schedule has none: remove it")
        return

    def no(detail: str) -> ConfigError:
        return ConfigError("nemesis.schedule", detail)
    servers, workers, replicas = run.cluster.servers, run.cluster.workers, run.cluster.replicas
    for kind, t in targets:
        if t.role in ("primary", "backup") and run.is_allreduce:
            raise no(f"{t}: mode {run.mode!r} has no shards; name a worker:R")
        if t.role in ("primary", "backup") and t.index is not None and t.index >= servers:
            raise no(f"{t}: shard must be in 0..{servers - 1} (cluster.servers = {servers})")
        if t.role == "backup" and not replicas:
            raise no(f"{t}: the run has no backups; add cluster.replicas (--replicas 1)")
        if t.role == "worker" and t.index is not None and t.index >= workers:
            raise no(f"{t}: rank must be in 0..{workers - 1} (cluster.workers = {workers})")
        if t.role == "worker" and t.index is None and workers < 2:
            raise no(f"{t} draws from ranks 1..N-1 (rank 0 writes the final weights); the run has 1 worker")
        if kind == "kill" and t.role == "worker" and t.index == 0:
            raise no("kill worker:0: rank 0 writes the final weights; kill another rank")
    if "kill" in kinds and run.is_allreduce and any(t.role == "worker" for _, t in targets):
        raise no(f"kill: mode {run.mode!r} cannot lose a rank (its collectives wait for every rank)")
    if "disk_full" in kinds and not run.checkpoints.every:
        raise no("disk_full fills DIR/checkpoints, which only checkpoints.every (--checkpoint-every) writes: add it")
    if "partition" in kinds and run.cluster.transport != "zmq":
        raise no(f"partition cuts emulated hosts, which carry transport 'zmq'; transport "
                 f"{run.cluster.transport!r} stays on 127.0.0.1")
