"""Experiment specs: one TOML file naming a run (any key of the config tree, psrv/config) and the
variants to compare, each a few keys laid over it.

Load one with `load_spec("experiments/specs/modes.toml")`; docs/experiments.md shows the layout.
A spec's keys are the config tree's keys, so a spec, the command line and a run's config.json
always agree; `ExperimentSpec.run_config(variant, seed)` is exactly what one run trains with.
"""
from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from psrv.config import ConfigError, RunConfig, Section, from_dict, merge
from psrv.config.base import setting

# what collect.py and report.py write beside the variant directories
RESERVED_NAMES = ("plots", "runs.csv", "summary.csv", "report.md")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_RUN_KEYS = tuple(f.name for f in fields(RunConfig) if f.name != "seed")  # a spec gives seeds instead
_TOP_KEYS = ("name", "description", "seeds", "target", "variants", "profiles", *_RUN_KEYS)
_PROFILE_KEYS = ("description", "target", "only", "variant", *_RUN_KEYS)


@dataclass(frozen=True, kw_only=True)
class TargetSpec(Section):
    """The held-out quality a run must reach; with several keys, all must hold at one eval.

    `metric` + `value` target any metric the job reports (its evaluation's names: loss, accuracy,
    perplexity, ...); the direction is `lower_is_better` where given, else the job's own where the
    metric is the job's primary one, else lower for loss-like names (loss, perplexity, bits_per_byte,
    error, mse, mae) and higher for the rest."""

    eval_loss: float | None = setting(None, "reached when held-out loss <= this", minimum=0.0)
    eval_accuracy: float | None = setting(None, "reached when held-out accuracy >= this", minimum=0.0,
                                          above=True, maximum=1.0)
    metric: str | None = setting(None, "a metric the job's evaluation reports (e.g. perplexity); "
                                 "reached when it is at `value` or better")
    value: float | None = setting(None, "the value `metric` must reach")
    lower_is_better: bool | None = setting(None, "the direction of `metric` (default: the job's own, "
                                           "else lower for loss-like names)")

    def validate(self) -> None:
        if (self.metric is None) != (self.value is None):
            raise ConfigError("", "give metric and value together (e.g. metric = \"perplexity\", value = 20)")
        if self.lower_is_better is not None and self.metric is None:
            raise ConfigError("lower_is_better", "only means something with metric and value")
        if self.eval_loss is None and self.eval_accuracy is None and self.metric is None:
            raise ConfigError("", "give eval_loss, eval_accuracy, or metric and value")

    def lower(self, job_metric: str | None = None, job_lower_is_better: bool | None = None) -> bool:
        """Whether `metric` is better lower: given, else the job's (if it is the job's metric), else by name."""
        if self.lower_is_better is not None:
            return self.lower_is_better
        if job_lower_is_better is not None and job_metric == self.metric:
            return job_lower_is_better
        from psrv.metric_names import lower_is_better_by_name
        return lower_is_better_by_name(self.metric or "")

    def reached(self, row: Mapping[str, float | None], *, lower: bool | None = None) -> bool:
        """Whether one evaluation (`eval_<name>` values; missing or NaN never do) meets every given target.
        `lower`: the direction of `metric` (default: TargetSpec.lower())."""
        def at_most(key: str, bound: float) -> bool:
            v = row.get(key)
            return v is not None and v <= bound
        def at_least(key: str, bound: float) -> bool:
            v = row.get(key)
            return v is not None and v >= bound
        if self.eval_loss is not None and not at_most("eval_loss", self.eval_loss):
            return False
        if self.eval_accuracy is not None and not at_least("eval_accuracy", self.eval_accuracy):
            return False
        if self.metric is not None:
            lower = self.lower() if lower is None else lower
            return (at_most if lower else at_least)(f"eval_{self.metric}", self.value)
        return True

    def describe(self, lower: bool | None = None) -> str:
        parts = [f"eval_loss <= {self.eval_loss:g}"] if self.eval_loss is not None else []
        if self.eval_accuracy is not None:
            parts.append(f"eval_accuracy >= {self.eval_accuracy:g}")
        if self.metric is not None:
            lower = self.lower() if lower is None else lower
            parts.append(f"{self.metric} {'<=' if lower else '>='} {self.value:g}")
        return " and ".join(parts)


@dataclass(frozen=True)
class Variant:
    """One way to run the job: its name, the keys it lays over the experiment's, and the result."""

    name: str
    overrides: Mapping[str, Any]
    config: RunConfig  # with the experiment's first seed

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def staleness(self) -> int | None:
        return self.config.staleness if self.config.mode == "ssp" else None


def default_name(cfg: RunConfig) -> str:
    """'sync', 'sync-b1', 'sync-q2', 'ssp-2', 'async' or 'ddp'."""
    if cfg.mode == "ssp":
        return f"ssp-{cfg.staleness}"
    if cfg.quorum:
        return (f"sync-q{cfg.quorum}" + (f"-age{cfg.quorum_max_age}" if cfg.quorum_max_age else "")
                + (f"-grace{cfg.quorum_grace:g}" if cfg.quorum_grace else "") + ("-wait" if cfg.quorum_wait else ""))
    return f"sync-b{cfg.backup_workers}" if cfg.backup_workers else cfg.mode


@dataclass(frozen=True, kw_only=True)
class ExperimentSpec:
    """A base run, a target, the variants to run with each seed."""

    name: str
    base: Mapping[str, Any]  # the run keys the experiment gives (as in the TOML)
    target: TargetSpec
    variants: tuple[Variant, ...]
    seeds: tuple[int, ...] = (0,)
    description: str = ""

    @property
    def repeats(self) -> int:
        return len(self.seeds)

    @property
    def config(self) -> RunConfig:
        """The experiment's own run (no variant), with its first seed."""
        return from_dict(RunConfig, {**self.base, "seed": self.seeds[0]})

    def with_settings(self, **keys: Any) -> ExperimentSpec:
        """This spec with top-level run settings (`tensorboard=...`) given for the experiment and every
        variant, as the command line gives them."""
        variants = tuple(replace(v, overrides={**v.overrides, **keys}, config=v.config.replace(**keys))
                         for v in self.variants)
        return replace(self, base={**self.base, **keys}, variants=variants)

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise KeyError(f"no variant {name!r}; variants: {', '.join(v.name for v in self.variants)}")

    def runs(self) -> Iterator[tuple[Variant, int, int]]:
        """(variant, seed, repeat index), repeat-major: every variant's rep-0, then rep-1, ..."""
        for repeat, seed in enumerate(self.seeds):
            for variant in self.variants:
                yield variant, seed, repeat

    def run_config(self, variant: Variant, seed: int) -> RunConfig:
        """Exactly what one run of `variant` with `seed` trains with."""
        return variant.config.replace(seed=seed)

    def steps_given(self, variant: Variant) -> bool:
        """Whether the spec gives job.steps for `variant` (a script gets it as PSRV_STEPS only then)."""
        return "steps" in merge(self.base, variant.overrides).get("job", {})

def _table(where: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(where, f"must be a table ([{where}]); got {raw!r}")
    return raw


def _check_keys(where: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    import difflib
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}.{key}" if where else key, f"{hint}; allowed: {', '.join(allowed)}",
                              unknown=True)


def _seeds(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("seeds", f"give at least one seed, e.g. seeds = [0, 1]; got {raw!r}")
    for i, seed in enumerate(raw):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"seeds[{i}]", f"must be an integer >= 0; got {seed!r}")
        if seed in raw[:i]:
            raise ConfigError(f"seeds[{i}]", f"duplicate seed {seed}; seeds must be unique")
    return tuple(raw)


def _variant(i: int, raw: Any, base: Mapping[str, Any], seed: int) -> Variant:
    where = f"variants[{i}]"
    table = dict(_table(where, raw))
    _check_keys(where, table, ("name", *_RUN_KEYS))
    name = table.pop("name", None)
    try:
        cfg = from_dict(RunConfig, merge({**base, "seed": seed}, table))
    except ConfigError as err:
        raise err.under(where) from None
    cfg = _with_script(where, cfg, merge(base, table))
    if "staleness" in table and cfg.mode != "ssp":
        raise ConfigError(f"{where}.staleness", f"only used when mode = 'ssp' (mode is {cfg.mode!r}); remove it")
    name = default_name(cfg) if name is None else name
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in RESERVED_NAMES:
        raise ConfigError(f"{where}.name", "must be 1-64 characters from A-Z a-z 0-9 _ . - starting with a "
                                           f"letter or digit, and not {', '.join(RESERVED_NAMES)}; got {name!r}")
    return Variant(name=name, overrides=table, config=cfg)


def _given_keys(tree: Mapping[str, Any], prefix: str = "") -> set[str]:
    return {k for key, v in tree.items()
            for k in (_given_keys(v, f"{prefix}{key}.") if isinstance(v, Mapping) else {f"{prefix}{key}"})}


def _with_script(where: str, cfg: RunConfig, given: Mapping[str, Any]) -> RunConfig:
    """A run whose [job] names a script: the script's hash taken now (a changed script is another config),
    and what a script's run cannot use refused, naming the key (experiments/launcher/script.py)."""
    keys = _given_keys(given)
    if not cfg.job.script:
        for key in ("job.script_args", "job.script_sha256"):
            if key in keys:
                raise ConfigError(f"{where}.{key}" if where else key, "only used with job.script")
        return cfg
    from psrv.experiments.launcher.script import check_script_run, with_script
    if "job.script_sha256" in keys:
        raise ConfigError(f"{where}.job.script_sha256" if where else "job.script_sha256",
                          "is computed from the script when the spec is read; remove it")
    if "job.name" in keys:
        raise ConfigError(f"{where}.job" if where else "job", "give script or name, not both")
    try:
        cfg = with_script(cfg, cfg.job.script, cfg.job.script_args)
        check_script_run(cfg, keys, flags=False)
    except ValueError as exc:
        raise ConfigError(f"{where}.job.script" if where else "job.script", str(exc)) from None
    return cfg


def profile_names(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of a parsed spec's [profiles.NAME] tables."""
    return tuple(_table("profiles", raw.get("profiles", {})))


def with_profile(raw: Mapping[str, Any], profile: str) -> dict[str, Any]:
    """The parsed spec `raw` as its [profiles.PROFILE] table says: the same variants on another job.

    A profile gives run keys laid over the spec's own (job, optimizer, network, ...), a `target` in place of
    the spec's, `only` (the variants it runs, by name; default all) and `variant.NAME` tables laid over that
    variant's own keys. The result is named NAME-PROFILE, so its runs and report never pass for the spec's."""
    where = f"profiles.{profile}"
    profiles = _table("profiles", raw.get("profiles", {}))
    if profile not in profiles:
        names = ", ".join(profiles) or "none"
        raise ConfigError("profiles", f"no profile {profile!r}; this spec's profiles: {names}")
    table = dict(_table(where, profiles[profile]))
    _check_keys(where, table, _PROFILE_KEYS)
    variants = raw.get("variants")
    if not isinstance(variants, list):
        return dict(raw)  # spec_from_dict names the missing [[variants]]
    names = [v.get("name") if isinstance(v, dict) else None for v in variants]
    only = table.pop("only", None)
    if only is not None:
        if not isinstance(only, list) or not only or not all(isinstance(n, str) for n in only):
            raise ConfigError(f"{where}.only", f"a list of variant names; got {only!r}")
        for name in only:
            if name not in names:
                raise ConfigError(f"{where}.only", f"no variant {name!r} (give each variant a name); variants: "
                                  f"{', '.join(str(n) for n in names)}")
    per_variant = dict(_table(f"{where}.variant", table.pop("variant", {})))
    for name in per_variant:
        if name not in names:
            raise ConfigError(f"{where}.variant.{name}", f"no variant of that name; variants: "
                              f"{', '.join(str(n) for n in names)}")
        _check_keys(f"{where}.variant.{name}", _table(f"{where}.variant.{name}", per_variant[name]), _RUN_KEYS)
    out = {key: value for key, value in raw.items() if key not in ("profiles", "variants")}
    out["name"] = f"{raw.get('name', '')}-{profile}"
    description = table.pop("description", "")
    if description:
        out["description"] = description
    if "target" in table:
        out["target"] = table.pop("target")
    out.update(merge({k: raw[k] for k in _RUN_KEYS if k in raw}, table))
    out["variants"] = [merge(v, per_variant.get(n, {})) for v, n in zip(variants, names)
                       if only is None or n in only]
    return out


def spec_from_dict(raw: Mapping[str, Any], profile: str | None = None) -> ExperimentSpec:
    """Build and validate a spec from parsed TOML (the layout docs/experiments.md describes), as its
    [profiles.PROFILE] table says where `profile` is given."""
    _check_keys("", raw, _TOP_KEYS)
    if profile is not None:
        raw = with_profile(raw, profile)
    for key, hint in (("name", "the experiment's name"), ("target", "a [target] table with eval_loss, "
                      "eval_accuracy, or metric and value"), ("variants", "[[variants]] tables, each with a mode")):
        if key not in raw:
            raise ConfigError(key, f"required: {hint}")
    if not isinstance(raw["name"], str) or not raw["name"].strip():
        raise ConfigError("name", "must be a non-empty string")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ConfigError("description", "must be a string")
    seeds = _seeds(raw.get("seeds", [0]))
    base = {key: raw[key] for key in _RUN_KEYS if key in raw}
    from_dict(RunConfig, {**base, "seed": seeds[0]})  # the experiment's own keys, checked on their own first
    target = from_dict(TargetSpec, _table("target", raw["target"]), where="target")
    if not isinstance(raw["variants"], list) or not raw["variants"]:
        raise ConfigError("variants", "give at least one [[variants]] table with a mode")
    variants: list[Variant] = []
    for i, item in enumerate(raw["variants"]):
        variant = _variant(i, item, base, seeds[0])
        for j, other in enumerate(variants):
            if other.name == variant.name:
                raise ConfigError(f"variants[{i}].name", f"duplicate variant name {variant.name!r} (also "
                                  f"variants[{j}]); names must be unique, set name = '...' on one of them")
        variants.append(variant)
    return ExperimentSpec(name=raw["name"], base=base, target=target, variants=tuple(variants), seeds=seeds,
                          description=description)


def load_spec(path: str | Path, profile: str | None = None) -> ExperimentSpec:
    """Read and validate a TOML spec (as its [profiles.PROFILE] says, where given); any mistake raises
    ConfigError (a ValueError) naming file and key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such spec file") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None
    try:
        return spec_from_dict(raw, profile)
    except ConfigError as err:
        raise err.within(str(path)) from None
