"""Collect an experiment's run directories into per-variant CSVs and one summary table.

Reads DIR/<variant>/rep-<k>/{summary.json,steps.csv,evals.csv}; writes DIR/<variant>/steps.csv
and evals.csv (all repeats, with a `repeat` column), DIR/runs.csv (one row per run) and
DIR/summary.csv (one row per variant: mean and sample std over repeats). Only the repeats the spec
has (rep-0 .. rep-<seeds - 1>) are read; runs kept aside (rep-<k>.replaced-<hash>) never are.

A repeat whose held-out loss is NaN or Inf, at the end or at any evaluation, **diverged**: it counts among
the repeats (and in `diverged`), its non-finite values make a mean over repeats no number (empty, never the
mean of the others), and it never reached the target, even where an evaluation met it before it diverged.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psrv.config.base import config_hash

from psrv.experiments.launcher.provenance import stored_config
from psrv.experiments.harness.goodput import baselines, first_configs, useful_rates
from psrv.experiments.harness.spec import ExperimentSpec, TargetSpec, Variant
from psrv.experiments.harness.traffic import busiest
from psrv.atomic import replacing

log = logging.getLogger(__name__)

METRICS = ("wall_seconds", "samples_per_second", "final_loss", "eval_accuracy", "final_target_metric",
           "time_to_target_seconds", "updates_applied", "mean_staleness", "max_staleness",
           "wait_fraction", "seconds_per_step", "busiest_bytes_in_per_step", "busiest_bytes_out_per_step",
           "server_own_bytes_per_step", "bytes_per_sample", "compression_ratio",
           "useful_samples_per_second", "useful_samples_per_second_end_to_end", "goodput",
           "goodput_end_to_end")  # experiments/harness/goodput.py
_FROM_SUMMARY = ("wall_seconds", "samples_per_second", "final_loss", "eval_accuracy",
                 "updates_applied", "mean_staleness", "max_staleness",
                 "bytes_per_sample", "compression_ratio")  # the workers' measured wire bytes (docs/compression.md)
RUN_COLUMNS = ("variant", "repeat", "mode", "staleness", "reached_target", "diverged", *METRICS, "config_hash")
SUMMARY_COLUMNS = ("variant", "mode", "staleness", "repeats", "diverged", "failed", "target_reached",
                   *(name for metric in METRICS for name in (metric, f"{metric}_std")))
_REP_RE = re.compile(r"rep-([0-9]+)")
SKIPPED_FILE = "skipped.txt"  # DIR/<variant>/skipped.txt: why the runner did not run that variant here
ERROR_FILE = "error.txt"  # DIR/<variant>/rep-<k>/error.txt: why that run failed (experiments/harness/runner.py)


def run_dir(out_dir: str | Path, variant: str, repeat: int) -> Path:
    """Where one run writes: DIR/<variant>/rep-<repeat>."""
    return Path(out_dir) / variant / f"rep-{repeat}"


def is_finished(path: str | Path) -> bool:
    """Whether a run directory holds a summary.json that parses and is not marked incomplete (an
    interrupted run writes what ran with `complete` false; a summary from before that key is complete)."""
    try:
        summary = json.loads((Path(path) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("complete", True) is not False


def finished_repeats(out_dir: str | Path, variant: str) -> list[tuple[int, Path]]:
    """(repeat index, run dir) of every finished rep-<k> under DIR/<variant>, by index."""
    found = []
    root = Path(out_dir) / variant
    for path in root.iterdir() if root.is_dir() else ():
        match = _REP_RE.fullmatch(path.name)
        if match and path.is_dir():
            if is_finished(path):
                found.append((int(match.group(1)), path))
            else:
                log.warning("collect: skipping unfinished run %s (no summary.json of a complete run)", path)
    return sorted(found)


def spec_repeats(out_dir: str | Path, spec: ExperimentSpec, variant: str) -> list[tuple[int, Path]]:
    """The finished rep-<k> of `variant` that the spec has (k < its number of seeds); others are left out."""
    found = finished_repeats(out_dir, variant)
    for repeat, path in found:
        if repeat >= spec.repeats:
            log.warning("collect: leaving out %s: the spec has %d seed(s), so no rep-%d", path, spec.repeats,
                        repeat)
    return [(repeat, path) for repeat, path in found if repeat < spec.repeats]


def failed_repeats(out_dir: str | Path, spec: ExperimentSpec, variant: str) -> list[tuple[int, str]]:
    """(repeat index, the failure in a line) of each rep-<k> the spec has that the runner recorded as failed
    (its error.txt) and that has no finished summary: not among the repeats, but counted and named. The line
    is error.txt's first and, where the failed process's last lines follow it, its very last (what the
    process said as it stopped: a shard's refusal, a traceback's exception)."""
    failed = []
    for repeat in range(spec.repeats):
        path = run_dir(out_dir, variant, repeat)
        if (path / ERROR_FILE).exists() and not is_finished(path):
            lines = [x for x in (path / ERROR_FILE).read_text(errors="replace").splitlines() if x.strip()]
            said = lines[0] if lines else "(error.txt is empty)"
            failed.append((repeat, f"{said} ... {lines[-1].strip()}" if len(lines) > 1 else said))
    return failed


def stored_hash(path: str | Path) -> str:
    """The config hash of a run directory's stored config.json; empty if it has none that reads."""
    try:
        return config_hash(stored_config(path))
    except ValueError:
        return ""


def read_csv(path: str | Path) -> list[dict[str, str]]:
    """All rows of a CSV file as dicts; a missing file reads as no rows."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def _write_csv(path: Path, columns: list[str] | tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    with replacing(path, newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.10g}" if isinstance(value, float) else str(value)


def number(text: Any) -> float | None:
    """A CSV cell or JSON value as a float; empty, missing, non-numeric or NaN -> None."""
    value = measured(text)
    return None if value is None or math.isnan(value) else value


def measured(value: Any) -> float | None:
    """A JSON value or CSV cell as a float, NaN and Inf kept (a diverged run's loss is a measurement, not a
    missing value); empty, missing or non-numeric -> None."""
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def diverged(summary: dict, evals: list[dict[str, str]]) -> bool:
    """A run diverged: its final held-out loss (summary.json) or any evaluation's (evals.csv) is NaN or Inf."""
    losses = map(measured, [summary.get("final_loss"), *(row.get("eval_loss") for row in evals)])
    return any(v is not None and not math.isfinite(v) for v in losses)


def merge_variant(out_dir: str | Path, variant: str,
                  repeats: list[tuple[int, Path]] | None = None) -> tuple[Path, Path]:
    """Write DIR/<variant>/steps.csv and evals.csv: every finished repeat, `repeat` column first."""
    root = Path(out_dir) / variant
    repeats = finished_repeats(out_dir, variant) if repeats is None else repeats
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("steps.csv", "evals.csv"):
        columns: list[str] = ["repeat"]
        rows: list[dict[str, Any]] = []
        for repeat, path in repeats:
            part = read_csv(path / name)
            for column in part[0] if part else ():
                if column not in columns:
                    columns.append(column)
            rows += ({"repeat": repeat, **row} for row in part)
        _write_csv(root / name, columns, rows)
        written.append(root / name)
    return written[0], written[1]


def time_to_target(evals: list[dict[str, str]], target: TargetSpec, *, lower: bool | None = None) -> float | None:
    """Wall time of the first evaluation (in time order) that meets the target; None if none does.
    `lower`: the direction of the target's metric (see TargetSpec.lower)."""
    timed = [(number(row.get("wall_time")), row) for row in evals]
    for wall, row in sorted((pair for pair in timed if pair[0] is not None), key=lambda p: p[0]):
        if target.reached({key: number(value) for key, value in row.items()}, lower=lower):
            return wall
    return None


def wait_fraction(steps: list[dict[str, str]]) -> float | None:
    """sum(wait) / sum(compute + communication + wait) over all worker steps; None if no time."""
    parts = {key: sum(number(row.get(key)) or 0.0 for row in steps)
             for key in ("compute_seconds", "communication_seconds", "wait_seconds")}
    total = sum(parts.values())
    return parts["wait_seconds"] / total if total > 0 else None


@dataclass(frozen=True)
class RunMetrics:
    """The metrics of one run (one variant, one repeat); None where a value is missing."""

    variant: str
    repeat: int
    values: dict[str, float | None]
    diverged: bool = False

    @property
    def reached_target(self) -> bool:
        return self.values["time_to_target_seconds"] is not None


def run_metrics(path: str | Path, target: TargetSpec, *, variant: str = "",
                repeat: int = 0) -> RunMetrics:
    """Read one finished run directory and compute its metrics."""
    path = Path(path)
    summary = json.loads((path / "summary.json").read_text())
    values: dict[str, float | None] = {key: measured(summary.get(key)) for key in _FROM_SUMMARY}
    reported = summary.get("eval_metrics") or {}
    if target.metric is not None and reported and target.metric not in reported:
        raise ValueError(f"the target's metric {target.metric!r} is not among the metrics job "
                         f"{summary.get('job')!r} reports ({', '.join(sorted(reported))}); see {path / 'summary.json'}")
    values["final_target_metric"] = measured(reported.get(target.metric)) if target.metric else None
    lower = target.lower(summary.get("metric"), summary.get("lower_is_better")) if target.metric else None
    evals = read_csv(path / "evals.csv")
    lost = diverged(summary, evals)  # a target met before it diverged is not reached
    values["time_to_target_seconds"] = None if lost else time_to_target(evals, target, lower=lower)
    values["wait_fraction"] = wait_fraction(read_csv(path / "steps.csv"))
    steps, wall = number(summary.get("steps")), values["wall_seconds"]
    values["seconds_per_step"] = wall / steps if wall is not None and steps else None
    top = busiest(path)  # the busiest process's measured traffic (experiments/harness/traffic.py)
    values["busiest_bytes_in_per_step"] = top["in"] if top else None
    values["busiest_bytes_out_per_step"] = top["out"] if top else None
    values["server_own_bytes_per_step"] = top.get("own_count") if top else None  # in + out, with the start
    values["useful_samples_per_second"], values["useful_samples_per_second_end_to_end"] = useful_rates(path)
    values["goodput"] = values["goodput_end_to_end"] = None  # against the spec's fault-free variant (collect)
    return RunMetrics(variant=variant, repeat=repeat, values=values, diverged=lost)


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation over repeats; std is None with fewer than 2 values. A NaN or Inf
    among them (a diverged repeat's loss, a perplexity past float's range) makes both None, and `nonfinite` says
    so: no mean of the others stands for them all."""

    mean: float | None
    std: float | None
    nonfinite: bool = False

    @classmethod
    def of(cls, values: list[float | None]) -> Stat:
        known = [v for v in values if v is not None]
        if not known:
            return cls(None, None)
        if not all(math.isfinite(v) for v in known):
            return cls(None, None, nonfinite=True)
        return cls(statistics.fmean(known), statistics.stdev(known) if len(known) > 1 else None)


@dataclass(frozen=True)
class VariantSummary:
    """One row of summary.csv."""

    variant: str
    mode: str
    staleness: int | None
    repeats: int
    target_reached: int
    stats: dict[str, Stat]
    diverged: int = 0  # of the repeats
    failed: int = 0  # runs of the spec's seeds that failed (failed_repeats): not among the repeats

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"variant": self.variant, "mode": self.mode,
                               "staleness": self.staleness, "repeats": self.repeats, "diverged": self.diverged,
                               "failed": self.failed, "target_reached": self.target_reached}
        for metric, stat in self.stats.items():
            row[metric], row[f"{metric}_std"] = stat.mean, stat.std
        return row


def aggregate(variant: Variant, runs: list[RunMetrics], *, failed: int = 0) -> VariantSummary:
    """Mean and spread over repeats; time to target is empty unless every repeat reached it (a diverged
    repeat never did); a metric with a diverged repeat's NaN or Inf among its values is empty (Stat.of)."""
    stats = {metric: Stat.of([run.values[metric] for run in runs]) for metric in METRICS}
    reached = sum(run.reached_target for run in runs)
    if reached < len(runs):
        stats["time_to_target_seconds"] = Stat(None, None)
    return VariantSummary(variant=variant.name, mode=variant.mode, staleness=variant.staleness,
                          repeats=len(runs), target_reached=reached, stats=stats,
                          diverged=sum(run.diverged for run in runs), failed=failed)


def collect(out_dir: str | Path, spec: ExperimentSpec) -> list[VariantSummary]:
    """Merge every variant's repeats, then write DIR/runs.csv and DIR/summary.csv."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries, run_rows, found = [], [], {}
    for variant in spec.variants:
        repeats = spec_repeats(out, spec, variant.name)
        merge_variant(out, variant.name, repeats)
        runs = [run_metrics(path, spec.target, variant=variant.name, repeat=repeat)
                for repeat, path in repeats]
        if len(runs) < spec.repeats:
            log.warning("collect: variant %s has %d of %d repeats finished", variant.name,
                        len(runs), spec.repeats)
        found[variant.name] = (repeats, runs)
    _goodput(found)
    for variant in spec.variants:
        repeats, runs = found[variant.name]
        run_rows += [{"variant": variant.name, "repeat": run.repeat, "mode": variant.mode,
                      "staleness": variant.staleness, "reached_target": int(run.reached_target),
                      "diverged": int(run.diverged),
                      **run.values, "config_hash": stored_hash(path)} for run, (_, path) in zip(runs, repeats)]
        summaries.append(aggregate(variant, runs, failed=len(failed_repeats(out, spec, variant.name))))
    _write_csv(out / "runs.csv", RUN_COLUMNS, run_rows)
    _write_csv(out / "summary.csv", SUMMARY_COLUMNS, [s.row() for s in summaries])
    log.info("collect: wrote %s (%d variants)", out / "summary.csv", len(summaries))
    return summaries


def _goodput(found: dict[str, tuple[list[tuple[int, Path]], list[RunMetrics]]]) -> None:
    """Each run's goodput: its useful samples/s over the same repeat's of the variant that is the same run without
    its faults or stragglers (experiments/harness/goodput.py), where the spec has one."""
    configs = first_configs({name: [path for _, path in repeats] for name, (repeats, _) in found.items()})
    for name, base in baselines(configs).items():
        for metric, rate in (("goodput", "useful_samples_per_second"),
                             ("goodput_end_to_end", "useful_samples_per_second_end_to_end")):
            base_rates = {run.repeat: run.values[rate] for run in found[base][1]}
            for run in found[name][1]:
                mine, theirs = run.values[rate], base_rates.get(run.repeat)
                run.values[metric] = mine / theirs if mine is not None and theirs else None
        log.info("collect: goodput of %s against %s, the same runs without its faults", name, base)


def read_summary(out_dir: str | Path) -> list[VariantSummary]:
    """Read DIR/summary.csv back (as collect wrote it)."""
    path = Path(out_dir) / "summary.csv"
    if not path.exists():
        raise ValueError(f"{path} does not exist; run psrv.experiments.harness.collect.collect(out_dir, spec) "
                         "first")
    # (variant, metric) pairs whose runs (runs.csv) hold a NaN or Inf: an empty mean there is not finite, not missing
    runs = read_csv(path.parent / "runs.csv") if (path.parent / "runs.csv").exists() else []
    nonfinite = {(r["variant"], m) for r in runs for m in METRICS
                 if (v := measured(r.get(m))) is not None and not math.isfinite(v)}
    summaries = []
    for row in read_csv(path):
        stats = {}
        for m in METRICS:
            mean = number(row.get(m))
            lost = mean is None and (row["variant"], m) in nonfinite
            stats[m] = Stat(mean, number(row.get(f"{m}_std")), nonfinite=lost)
        staleness = number(row.get("staleness"))
        summaries.append(VariantSummary(
            variant=row["variant"], mode=row["mode"],
            staleness=None if staleness is None else int(staleness),
            repeats=int(row["repeats"]), target_reached=int(row["target_reached"]), stats=stats,
            diverged=int(number(row.get("diverged")) or 0),  # a summary.csv from before the column: 0
            failed=int(number(row.get("failed")) or 0)))
    return summaries
