"""summary.json's `goodput` block (and `history_check`) of a run with faults: built from the run's histories, its
faults, and a finished fault-free run named as its baseline (`psrv run --goodput-baseline DIR`)."""
from __future__ import annotations

import logging
from pathlib import Path

from psrv.config import RunConfig
from psrv.config.base import config_hash
from psrv.experiments.launcher.goodput.measure import Measured, by, fault_costs, measure, ratio, role
from psrv.experiments.launcher.goodput.steps import read_steps
from psrv.experiments.launcher.history import check_run
from psrv.experiments.launcher.history.reading import HistoryError
from psrv.experiments.launcher.provenance import describe, differences, stored_config

log = logging.getLogger("psrv.run")
# what a baseline may differ in: the faults themselves, and its length (its rate is what is compared)
FAULT_KEYS = ("nemesis.", "kill.", "restarts.", "job.steps")


def per_step(cfg: RunConfig) -> int:
    """Samples one push stands for: the batch, times the inner steps of local SGD (1 for 'auto', which plans them
    per round: its steps count one batch each)."""
    h = cfg.worker.local_steps
    return cfg.job.batch_size * (h if isinstance(h, int) else 1)


def measured(run: Path, cfg: RunConfig):
    """(the run's steps, its Measured or None)."""
    steps = read_steps(run, cfg.cluster.servers)
    return steps, measure(steps, per_step(cfg))


def baseline(folder: Path, cfg: RunConfig) -> dict:
    """The baseline's block: its folder, config hash, useful samples/s (same measure, from its own histories), end to
    end, and the settings it differs in from `cfg` beyond the faults and the steps. ValueError naming the folder
    when it is no finished run with a history."""
    try:
        base_cfg = stored_config(folder)
        _, m = measured(folder, base_cfg)
    except ValueError as exc:  # HistoryError is one
        raise ValueError(f"--goodput-baseline {folder}: {exc}; name the folder of a finished fault-free psrv run "
                         "of this job") from None
    if m is None or m.rate is None:
        raise ValueError(f"--goodput-baseline {folder}: its history holds no step applied on every shard")
    diffs = [d for d in differences(base_cfg, cfg) if not d[0].startswith(FAULT_KEYS)]
    if diffs:
        log.warning("goodput: the baseline %s differs from this run in %s", folder, describe(diffs))
    return {"run": str(folder), "config_hash": config_hash(base_cfg), "samples_per_second": round(m.rate, 3),
            "end_to_end_samples_per_second": round(m.whole_rate or 0.0, 3),
            "differs": [f"{key}: {a!r} vs {b!r}" for key, a, b in diffs]}


def goodput(run: Path, cfg: RunConfig, faults: list[dict], base: dict | None) -> dict:
    """The run's goodput block (docs/reliability.md, "Goodput"). `faults`: each done, with `id`, `kind`, `target`
    and `t` (time.monotonic()); `base`: `baseline(...)`'s block, or None (no ratio, no costs)."""
    steps, m = measured(run, cfg)
    rate = None if m is None else m.rate
    base_rate = None if base is None else base["samples_per_second"]
    every = list(steps.steps.values())
    useful = [s for s in every if s.useful]
    lost = {why: sum(1 for s in every if s.loss() == why) for why in ("unacknowledged", "dropped", "acknowledged")}
    twice, redone = sum(1 for s in useful if s.twice), len(steps.redone())
    rows, before = fault_costs(m, faults, base_rate) if m is not None else ([], None)
    n = per_step(cfg)
    return {"baseline": base, "samples_per_second": None if rate is None else round(rate, 3),
            "goodput": _round(ratio(rate, base_rate)),
            "end_to_end": None if m is None else {
                "samples_per_second": _round(m.whole_rate),
                "goodput": _round(ratio(m.whole_rate, None if base is None else base["end_to_end_samples_per_second"])),
                "tail_s": round(m.last - m.end, 3)},
            "span_s": None if m is None else round(m.span_s, 3), "samples_per_step": n,
            "steps": {"pushed": len(every), "useful": len(useful), "lost": sum(lost.values()),
                      "twice": twice + redone},
            "samples": {"useful": len(useful) * n, "lost": sum(lost.values()) * n, "twice": (twice + redone) * n},
            "lost": lost, "twice": {"applied_twice": twice, "redone": redone},
            "fault_cost_s": _total(rows, before), "before_faults_s": before, "faults": rows,
            "by_kind": by(rows, lambda r: r["kind"]),
            "by_kind_target": by(rows, lambda r: f"{r['kind']} {role(r['target'])}")}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _total(rows: list[dict], before: float | None) -> float | None:
    costs = [r["cost_s"] for r in rows if r["cost_s"] is not None]
    return None if before is None else round(before + sum(costs), 3)


def faults_done(summary_faults: dict, started: float) -> list[dict]:
    """Every fault done on purpose, from summary.json's `faults`: the nemesis's (each with its own `t`) and the
    --kill-server and --kill-worker kills (`wall_s` after the launcher's start, `started` on the same clock)."""
    nemesis = (summary_faults.get("nemesis") or {}).get("faults", [])
    done = [{k: f[k] for k in ("id", "kind", "target", "t")} for f in nemesis if f["done"]]
    done += [{"id": f"kill-{i}", "kind": "kill", "target": k["process"].replace("server-", "primary:").replace(
        "worker-", "worker:"), "t": started + k["wall_s"]} for i, k in enumerate(summary_faults.get("kills", []), 1)
        if k["killed"]]
    return done


def reckon(cfg: RunConfig, out: Path, summary: dict, *, base: dict | None, started: float) -> dict:
    """What psrv run adds to a finished run's summary.json (written already: the checker reads it): `goodput`
    where the run had faults or a baseline (`base`: `baseline(...)`, measured before the run started), and under
    a nemesis `history_check` (check_run's verdict). A history that cannot be read is said in the block
    (`error`), never raised: the run itself finished."""
    faults = summary.get("faults") or {}
    added: dict = {}
    if faults.get("nemesis"):
        try:
            added["history_check"] = check_run(out).to_dict()
        except HistoryError as exc:
            added["history_check"] = {"ok": None, "error": str(exc)}
    if faults or base is not None:
        try:
            added["goodput"] = goodput(out, cfg, faults_done(faults, started), base)
        except HistoryError as exc:
            log.warning("goodput: %s", exc)
            added["goodput"] = {"error": str(exc)}
    return added
