"""Goodput in an experiment (docs/experiments.md, "Goodput"): each run's useful samples per second, measured from
its histories as `psrv run --goodput-baseline` measures them (experiments/launcher/goodput/), and, for a variant
with faults or stragglers, that rate over the rate of the spec's variant that is the same run without them, repeat
by repeat (the same seed). A run's faults are its FAULTS settings; every other setting must be equal for a variant
to be another's baseline. report.md's Goodput section is experiments/harness/report.py's."""
from __future__ import annotations

import logging
from pathlib import Path

from psrv.config import RunConfig
from psrv.experiments.launcher.goodput.report import FAULT_KEYS, measured
from psrv.experiments.launcher.provenance import OUTPUT_KEYS, differences, stored_config

log = logging.getLogger(__name__)
# what a fault-free baseline may differ in: what `psrv run --goodput-baseline` allows (the faults, restarts and
# steps), the stragglers (not faults.compute_ms, the emulated compute every run of a comparison has), and where
# results also go
MAY_DIFFER = (*FAULT_KEYS, "faults.straggler", "faults.transient_stragglers", *OUTPUT_KEYS)


def useful_rates(run: Path) -> tuple[float | None, float | None]:
    """Run folder `run`'s useful samples per second (steps every shard applied) while every rank ran, and end to
    end (from its first push to its last useful step, with the tail in which the ranks that fell behind finish
    alone); (None, None) where it has no history (an all-reduce run records none), no stored config, or a history
    that holds none or cannot be read (those two said in the log)."""
    if not (run / "history").is_dir():
        return None, None
    try:
        _, m = measured(run, stored_config(run))
    except ValueError as exc:  # HistoryError is one
        log.warning("goodput: %s: %s", run, exc)
        return None, None
    return (None, None) if m is None else (m.rate, m.whole_rate)


def first_configs(found: dict[str, list[Path]]) -> dict[str, RunConfig]:
    """Each variant's first finished repeat's stored config (a variant whose run has none is left out)."""
    configs = {}
    for name, paths in found.items():
        try:
            if paths:
                configs[name] = stored_config(paths[0])
        except ValueError:
            continue
    return configs


def faulted(cfg: RunConfig, base: RunConfig) -> bool | None:
    """True where `cfg` is `base` with faults or stragglers added, False where the two are the same run, None
    where they differ in anything else."""
    if any(not key.startswith(MAY_DIFFER) for key, _, _ in differences(base, cfg)):
        return None
    return has_faults(cfg) and not has_faults(base)


def has_faults(cfg: RunConfig) -> bool:
    """Faults or stragglers done on purpose (restarts.workers is a remedy for them, not one)."""
    f = cfg.faults
    return bool(f.straggler or f.transient_stragglers or cfg.kill.server or cfg.kill.worker or cfg.nemesis.schedule)


def baselines(configs: dict[str, RunConfig]) -> dict[str, str]:
    """Variant -> the variant that is the same run without its faults (by each variant's first repeat's stored
    config), for every variant with faults that has one in the spec; the first such, in the spec's order."""
    out = {}
    for name, cfg in configs.items():
        for other, base in configs.items():
            if other != name and faulted(cfg, base):
                out[name] = other
                break
    return out
