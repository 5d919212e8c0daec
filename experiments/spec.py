"""Experiment specs: one TOML file naming a job and the variants (modes, faults) to compare.

Load one with `load_spec("experiments/specs/modes.toml")`; docs/experiments.md lists every key.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from experiments.spec_checks import (
    _DEVICE,
    SpecError,
    _Checked,
    _checked,
    _choice,
    _float,
    _int,
    _match,
    _parses,
    parse_straggler,
    parse_transient,
)
from psrv.config import OPTIMIZERS, TRANSPORTS
from psrv.config import RUN_MODES as MODES

# what collect.py and report.py write beside the variant directories
RESERVED_NAMES = ("plots", "runs.csv", "summary.csv", "report.md")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, kw_only=True)
class JobSpec(_Checked):
    """What to train: a job from workers/jobs, steps per worker, per-worker batch size."""

    name: str = _checked(_match, regex=r"[A-Za-z0-9_.-]+", allowed="a job name like 'digits_mlp'")
    steps: int = _checked(_int, minimum=1)
    batch_size: int = _checked(_int, 32, minimum=1)
    eval_every: int = _checked(_int, 25, minimum=0)  # 0: evaluate at the start and end only


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec(_Checked):
    """The optimizer the servers (or the DDP workers) apply."""

    name: str = _checked(_choice, "sgd", allowed=OPTIMIZERS)
    lr: float = _checked(_float, 0.05, above=True)
    momentum: float = _checked(_float, 0.0, maximum=1.0)
    weight_decay: float = _checked(_float, 0.0)

    def _validate(self) -> None:
        if self.momentum and self.name != "sgd":
            raise SpecError("momentum", f"only used by name = 'sgd' (with {self.name!r} the only "
                                        "allowed value is 0); remove it")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec(_Checked):
    """How many processes of each kind, where the parameters live, and the wire."""

    servers: int = _checked(_int, 1, minimum=1)
    workers: int = _checked(_int, 2, minimum=1)
    device: str = _checked(_match, "cpu", **_DEVICE)
    transport: str = _checked(_choice, "zmq", allowed=TRANSPORTS)


@dataclass(frozen=True, kw_only=True)
class FaultSpec(_Checked):
    """Injected slowness: extra compute per step, stragglers, network delay."""

    compute_ms: float = _checked(_float, 0.0)
    straggler: str = _checked(_parses, "", parse=parse_straggler)
    transient_stragglers: str = _checked(_parses, "", parse=parse_transient)
    net_delay_ms: float = _checked(_float, 0.0)


@dataclass(frozen=True, kw_only=True)
class TargetSpec(_Checked):
    """The held-out quality a run must reach; with both keys, both must hold at one eval."""

    eval_loss: float | None = _checked(_float, None)
    eval_accuracy: float | None = _checked(_float, None, maximum=1.0, above=True)

    def _validate(self) -> None:
        if self.eval_loss is None and self.eval_accuracy is None:
            raise SpecError("", "give at least one of eval_loss, eval_accuracy")

    def reached(self, eval_loss: float | None, eval_accuracy: float | None) -> bool:
        """Whether one evaluation meets every given target (missing or NaN values never do)."""
        if self.eval_loss is not None and not (eval_loss is not None and eval_loss <= self.eval_loss):
            return False
        return self.eval_accuracy is None or (eval_accuracy is not None
                                              and eval_accuracy >= self.eval_accuracy)

    def describe(self) -> str:
        parts = [f"eval_loss <= {self.eval_loss:g}"] if self.eval_loss is not None else []
        if self.eval_accuracy is not None:
            parts.append(f"eval_accuracy >= {self.eval_accuracy:g}")
        return " and ".join(parts)


@dataclass(frozen=True, kw_only=True)
class VariantSpec(_Checked):
    """One way to run the job; overrides left at None mean "as the experiment says"."""

    mode: str = _checked(_choice, allowed=MODES)
    name: str = ""
    staleness: int | None = _checked(_int, None, minimum=0)
    backup_workers: int = _checked(_int, 0, minimum=0)
    transport: str | None = _checked(_choice, None, allowed=TRANSPORTS)
    device: str | None = _checked(_match, None, **_DEVICE)
    faults: FaultSpec | None = None

    def _validate(self) -> None:
        if self.mode == "ssp" and self.staleness is None:
            raise SpecError("staleness", "required when mode = 'ssp' (an integer >= 0: the most "
                                         "clocks a worker may run ahead of the slowest)")
        if self.mode != "ssp" and self.staleness is not None:
            raise SpecError("staleness", f"only allowed when mode = 'ssp' (mode is {self.mode!r}); "
                                         "remove it")
        if self.backup_workers and self.mode != "sync":
            raise SpecError("backup_workers", f"only allowed when mode = 'sync' "
                                              f"(mode is {self.mode!r}); remove it")
        if self.transport is not None and self.mode == "ddp":
            raise SpecError("transport", "not used by mode = 'ddp' (it has no servers); remove it")
        if self.faults is not None and not isinstance(self.faults, FaultSpec):
            raise SpecError("faults", "must be a FaultSpec (a [variants.faults] table)")
        if self.name == "":
            object.__setattr__(self, "name", self.default_name())
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name) \
                or self.name in RESERVED_NAMES:
            raise SpecError("name", "must be 1-64 characters from A-Z a-z 0-9 _ . - starting with "
                                    f"a letter or digit, and not {', '.join(RESERVED_NAMES)}; "
                                    f"got {self.name!r}")

    def default_name(self) -> str:
        """'sync', 'sync-b1', 'ssp-2', 'async' or 'ddp'."""
        if self.mode == "ssp":
            return f"ssp-{self.staleness}"
        return f"sync-b{self.backup_workers}" if self.backup_workers else self.mode


@dataclass(frozen=True, kw_only=True)
class ExperimentSpec:
    """A job, a cluster, a target and the variants to run with each seed."""

    name: str
    job: JobSpec
    target: TargetSpec
    variants: tuple[VariantSpec, ...]
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    faults: FaultSpec = field(default_factory=FaultSpec)
    seeds: tuple[int, ...] = (0,)
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", tuple(self.variants))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if not isinstance(self.name, str) or not self.name.strip():
            raise SpecError("name", "must be a non-empty string")
        if not isinstance(self.description, str):
            raise SpecError("description", "must be a string")
        for key, cls in (("job", JobSpec), ("target", TargetSpec), ("optimizer", OptimizerSpec),
                         ("cluster", ClusterSpec), ("faults", FaultSpec)):
            if not isinstance(getattr(self, key), cls):
                raise SpecError(key, f"must be a {cls.__name__} (a [{key}] table)")
        if not self.seeds:
            raise SpecError("seeds", "give at least one seed, e.g. seeds = [0, 1]")
        for i, seed in enumerate(self.seeds):
            _int(f"seeds[{i}]", seed, minimum=0)
            if seed in self.seeds[:i]:
                raise SpecError(f"seeds[{i}]", f"duplicate seed {seed}; seeds must be unique")
        if not self.variants:
            raise SpecError("variants", "give at least one [[variants]] table with a mode "
                                        f"({', '.join(MODES)})")
        seen: dict[str, int] = {}
        for i, variant in enumerate(self.variants):
            where = f"variants[{i}]"
            if not isinstance(variant, VariantSpec):
                raise SpecError(where, "must be a VariantSpec")
            if variant.name in seen:
                raise SpecError(f"{where}.name", f"duplicate variant name {variant.name!r} (also "
                                                 f"variants[{seen[variant.name]}]); names must be "
                                                 "unique, set name = '...' on one of them")
            seen[variant.name] = i
            if variant.backup_workers >= self.cluster.workers:
                raise SpecError(f"{where}.backup_workers", "must be < cluster.workers "
                                                           f"({self.cluster.workers}); got "
                                                           f"{variant.backup_workers}")
            straggler = parse_straggler(self.faults_for(variant).straggler)
            if straggler and straggler[0] >= self.cluster.workers:
                key = f"{where}.faults.straggler" if variant.faults else "faults.straggler"
                raise SpecError(key, f"rank must be in 0..{self.cluster.workers - 1} "
                                     f"(cluster.workers = {self.cluster.workers}); got {straggler[0]}")

    @property
    def repeats(self) -> int:
        return len(self.seeds)

    def variant(self, name: str) -> VariantSpec:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise KeyError(f"no variant {name!r}; variants: {', '.join(v.name for v in self.variants)}")

    def faults_for(self, variant: VariantSpec) -> FaultSpec:
        return variant.faults if variant.faults is not None else self.faults

    def transport_for(self, variant: VariantSpec) -> str:
        return variant.transport or self.cluster.transport

    def device_for(self, variant: VariantSpec) -> str:
        return variant.device or self.cluster.device

    def runs(self) -> Iterator[tuple[VariantSpec, int, int]]:
        """(variant, seed, repeat index), repeat-major: every variant's rep-0, then rep-1, ..."""
        for repeat, seed in enumerate(self.seeds):
            for variant in self.variants:
                yield variant, seed, repeat

    def run_argv(self, variant: VariantSpec, seed: int) -> list[str]:
        """The `psrv run` flags for one run, without --out."""
        job, opt, faults = self.job, self.optimizer, self.faults_for(variant)
        argv = ["--servers", str(self.cluster.servers), "--workers", str(self.cluster.workers),
                "--mode", variant.mode]
        if variant.mode == "ssp":
            argv += ["--staleness", str(variant.staleness)]
        if variant.mode == "sync":
            argv += ["--backup-workers", str(variant.backup_workers)]
        argv += ["--job", job.name, "--steps", str(job.steps), "--batch-size", str(job.batch_size),
                 "--optimizer", opt.name, "--lr", repr(opt.lr)]
        if opt.name == "sgd":
            argv += ["--momentum", repr(opt.momentum)]
        argv += ["--weight-decay", repr(opt.weight_decay), "--seed", str(seed),
                 "--device", self.device_for(variant), "--transport", self.transport_for(variant),
                 "--eval-every", str(job.eval_every), "--compute-ms", repr(faults.compute_ms)]
        if faults.straggler:
            argv += ["--straggler", faults.straggler]
        if faults.transient_stragglers:
            argv += ["--transient-stragglers", faults.transient_stragglers]
        return argv + ["--net-delay-ms", repr(faults.net_delay_ms)]


_SECTIONS: dict[str, type] = {"job": JobSpec, "optimizer": OptimizerSpec, "cluster": ClusterSpec,
                              "faults": FaultSpec, "target": TargetSpec}
_TOP_KEYS = ("name", "description", "seeds", *_SECTIONS, "variants")
_REQUIRED_HINTS = {"mode": f"one of {', '.join(MODES)}", "name": "a job name, e.g. 'digits_mlp'",
                   "steps": "an integer >= 1 (steps per worker)",
                   "target": "a [target] table with at least one of eval_loss, eval_accuracy",
                   "job": "a [job] table with name, steps and optionally batch_size, eval_every",
                   "variants": f"[[variants]] tables, each with a mode ({', '.join(MODES)})"}


def _check_keys(where: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SpecError(f"{where}.{key}" if where else key,
                            f"{hint}; allowed: {', '.join(allowed)}", unknown=True)


def _table(where: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SpecError(where, f"must be a table ([{where}]); got {raw!r}")
    return raw


def _build(cls: type, where: str, raw: Any) -> Any:
    table = _table(where, raw)
    names = tuple(f.name for f in fields(cls))
    _check_keys(where, table, names)
    for f in fields(cls):
        if f.default is MISSING and f.default_factory is MISSING and f.name not in table:
            hint = _REQUIRED_HINTS.get(f.name, "")
            raise SpecError(f"{where}.{f.name}", f"required{'; ' + hint if hint else ''}")
    try:
        return cls(**table)
    except SpecError as err:
        raise err.under(where) from None


def spec_from_dict(raw: Mapping[str, Any]) -> ExperimentSpec:
    """Build and validate a spec from parsed TOML (the layout docs/experiments.md describes)."""
    _check_keys("", raw, _TOP_KEYS)
    for key in ("name", "job", "target", "variants"):
        if key not in raw:
            raise SpecError(key, f"required; {_REQUIRED_HINTS.get(key, 'the experiment name')}")
    sections = {key: _build(cls, key, raw[key]) for key, cls in _SECTIONS.items() if key in raw}
    top_faults = _table("faults", raw.get("faults", {}))
    if not isinstance(raw["variants"], list):
        raise SpecError("variants", "must be an array of tables ([[variants]] with mode = ...)")
    variants = []
    for i, item in enumerate(raw["variants"]):
        where = f"variants[{i}]"
        table = dict(_table(where, item))
        _check_keys(where, table, tuple(f.name for f in fields(VariantSpec)))
        if "faults" in table:  # a variant's faults override the experiment's, key by key
            own = _table(f"{where}.faults", table["faults"])
            _check_keys(f"{where}.faults", own, tuple(f.name for f in fields(FaultSpec)))
            table["faults"] = _build(FaultSpec, f"{where}.faults", {**top_faults, **own})
        variants.append(_build(VariantSpec, where, table))
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list):
        raise SpecError("seeds", f"must be an array of integers >= 0, e.g. [0, 1]; got {seeds!r}")
    return ExperimentSpec(name=raw["name"], description=raw.get("description", ""),
                          variants=tuple(variants), seeds=tuple(seeds), **sections)


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate a TOML spec; any mistake raises ValueError naming file and key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None
    try:
        return spec_from_dict(raw)
    except SpecError as err:
        raise SpecError(err.key, err.detail, unknown=err.unknown, source=str(path)) from None
