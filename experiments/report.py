"""DIR/report.md (with the plots of experiments/plots) for an experiment that collect.py has collected."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from experiments.collect import Stat, VariantSummary, read_summary
from experiments.plots import write_plots
from experiments.report_configs import (command_lines, disagreement_section, disagreements,
                                        mixed_folder_lines, setup_lines, stored_runs)
from experiments.report_traffic import skipped_lines, traffic_lines
from experiments.spec import ExperimentSpec
from experiments.winner import winner_lines
from psrv.config import MODES

log = logging.getLogger(__name__)


def _num(x: float, digits: int) -> str:
    return f"{x:.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"


def _fmt(stat: Stat, digits: int = 4) -> str:
    if stat.mean is None:
        return "—"
    text = _num(stat.mean, digits)
    return f"{text} ± {_num(stat.std, 2)}" if stat.std is not None else text


def _table(summaries: list[VariantSummary], metric: str | None = None) -> list[str]:
    """The summary table; `metric` (the target's, when not accuracy) takes the accuracy column's place."""
    quality = metric if metric and metric != "accuracy" else None
    head = ["variant", "mode", "s", "repeats", "wall s", "samples/s", "final loss", quality or "accuracy",
            "time to target s", "updates", "mean stale", "max stale", "wait frac"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        st = s.stats
        stale = "n/a" if s.mode not in MODES else None  # all-reduce has no staleness, not a staleness of 0
        ttt = "no runs" if not s.repeats else _fmt(st["time_to_target_seconds"]) \
            if s.target_reached == s.repeats else f"not reached ({s.target_reached}/{s.repeats})"
        cells = [f"`{s.variant}`", s.mode, "" if s.staleness is None else str(s.staleness),
                 str(s.repeats), _fmt(st["wall_seconds"]), _fmt(st["samples_per_second"]),
                 _fmt(st["final_loss"]), _fmt(st["final_target_metric" if quality else "eval_accuracy"], 3), ttt,
                 _fmt(st["updates_applied"]), stale or _fmt(st["mean_staleness"], 3),
                 stale or _fmt(st["max_staleness"], 3), _fmt(st["wait_fraction"], 3)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ttt(s: VariantSummary) -> float | None:
    return s.stats["time_to_target_seconds"].mean


def _ddp_gap(summaries: list[VariantSummary]) -> list[str]:
    ddp = next((s for s in summaries if s.mode == "ddp"), None)
    if ddp is None:
        return ["There is no `ddp` variant in this spec, so there is no DDP gap to report."]
    if not ddp.repeats:
        return [f"The DDP baseline `{ddp.variant}` has no finished runs, so there is no DDP gap."]
    base_t, base_sps = _ttt(ddp), ddp.stats["samples_per_second"].mean
    lines = [f"Each variant against the DDP baseline `{ddp.variant}`: time to target ÷ DDP's "
             "(above 1: slower to the target) and throughput ÷ DDP's (below 1: fewer samples/s).",
             "", "| variant | time to target s | ÷ ddp | samples/s | ÷ ddp |", "|---|---|---|---|---|"]
    for s in summaries:
        t, sps = _ttt(s), s.stats["samples_per_second"].mean
        t_ratio = f"{t / base_t:.2f}" if t is not None and base_t else "—"
        s_ratio = f"{sps / base_sps:.2f}" if sps is not None and base_sps else "—"
        lines.append(f"| `{s.variant}` | {'—' if t is None else f'{t:.3g}'} | {t_ratio} | "
                     f"{'—' if sps is None else f'{sps:.4g}'} | {s_ratio} |")
    if base_t is None:
        lines += ["", f"`{ddp.variant}` did not reach the target in every repeat, so no time ratio."]
    return lines


def _ddp_gaps(summaries: list[VariantSummary], spec: ExperimentSpec) -> list[str]:
    """The DDP gap; with ddp variants at several worker counts, one table per count, each variant
    against the ddp variant with as many workers."""
    workers = {v.name: v.config.cluster.workers for v in spec.variants}
    counts = sorted({workers[s.variant] for s in summaries if s.mode == "ddp"})
    if len(counts) < 2:
        return _ddp_gap(summaries)
    lines = []
    for n in counts:
        lines += [f"### {n} workers", "", *_ddp_gap([s for s in summaries if workers[s.variant] == n]), ""]
    return lines


def _direction(runs, spec: ExperimentSpec) -> bool | None:
    """The direction of the target's metric as the runs' own summaries declare it (None: no metric)."""
    if spec.target.metric is None:
        return None
    for run in runs:
        try:
            summary = json.loads((run.path / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        if summary.get("metric") is not None:
            return spec.target.lower(summary.get("metric"), summary.get("lower_is_better"))
    return spec.target.lower()


def write_report(out_dir: str | Path, spec: ExperimentSpec, *, spec_path: str | Path,
                 versions: dict[str, str]) -> Path:
    """Write DIR/plots/*.png and DIR/report.md from DIR/summary.csv, the merged CSVs and each run's stored
    config.json (what was run, and whether the runs agree with each other and with the spec)."""
    out = Path(out_dir)
    summaries = read_summary(out)
    plots = write_plots(out, spec, summaries)
    runs = stored_runs(out, spec)  # what was run is what each run stored, not what the spec says now
    problems = disagreements(runs, spec)
    target = spec.target.describe(_direction(runs, spec))
    lines = [f"# Experiment report: {spec.name}", ""]
    lines += [spec.description, ""] if spec.description else []
    lines += [f"- Spec: `{spec_path}` (name `{spec.name}`)", *mixed_folder_lines(out, spec_path),
              *setup_lines(runs, spec, problems),
              f"- Target: {target}",
              "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
              "", *disagreement_section(problems), *skipped_lines(out, spec),
              "## Result", "", *winner_lines(summaries, target), "",
              "## DDP gap", "",
              *_ddp_gaps(summaries, spec), "", "## Summary", "",
              "Mean ± sample std over repeats (summary.csv has every value; "
              "docs/experiments.md defines each column).", "", *_table(summaries, spec.target.metric), "",
              *traffic_lines(spec, summaries), "## Plots", ""]
    for caption, rel in plots:
        lines += [f"### {caption}", "", f"![{caption}]({rel})", ""]
    lines += command_lines(runs, spec)
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    log.info("report: wrote %s", path)
    return path
