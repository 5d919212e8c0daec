"""DIR/report.md (with the plots of experiments/harness/plots) for an experiment that collect.py has collected."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from psrv.experiments.harness.collect import Stat, VariantSummary, failed_repeats, number, read_csv, read_summary
from psrv.experiments.harness.goodput import baselines, has_faults
from psrv.experiments.harness.plots import write_plots
from psrv.experiments.harness.report_regions import regions_lines
from psrv.experiments.harness.report_configs import (command_lines, disagreement_section, disagreements,
                                        mixed_folder_lines, overridden_section, setup_lines, stored_runs,
                                        StoredRun)
from psrv.experiments.harness.report_behind import behind_lines
from psrv.experiments.launcher.worker_restarts import unrecorded_steps
from psrv.experiments.harness.report_traffic import skipped_lines, traffic_lines
from psrv.experiments.harness.spec import ExperimentSpec
from psrv.experiments.harness.winner import winner_lines
from psrv.config import MODES

log = logging.getLogger(__name__)


def _num(x: float, digits: int) -> str:
    """`digits` significant digits; a whole number from 10**digits on (6939, not 6.939e+03), in powers of ten
    from a billion on (a collapsed run's perplexity)."""
    return f"{x:.0f}" if 10 ** digits <= abs(x) < 1e9 else f"{x:.{digits}g}"


def _fmt(stat: Stat, digits: int = 4) -> str:
    if stat.mean is None:
        return "not finite" if stat.nonfinite else "—"
    text = _num(stat.mean, digits)
    return f"{text} ± {_num(stat.std, 2)}" if stat.std is not None else text


def _lost(s: VariantSummary, stat: Stat, digits: int = 4) -> str:
    """A quality metric's cell: its mean ± std, or where a diverged repeat's NaN left none, which diverged."""
    return f"diverged ({s.diverged}/{s.repeats})" if stat.mean is None and s.diverged else _fmt(stat, digits)


def _table(summaries: list[VariantSummary], metric: str | None = None) -> list[str]:
    """The summary table; `metric` (the target's, when not accuracy) takes the accuracy column's place. A
    diverged repeat is counted and named (docs/experiments.md, "Diverged repeats")."""
    quality = metric if metric and metric != "accuracy" else None
    head = ["variant", "mode", "s", "repeats", "wall s", "samples/s", "final loss", quality or "accuracy",
            "time to target s", "updates", "mean stale", "max stale", "wait frac", "bytes / sample"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        st = s.stats
        stale = "n/a" if s.mode not in MODES else None  # all-reduce has no staleness, not a staleness of 0
        lost = f"; {s.diverged} diverged" if s.diverged else ""
        failed = f"{s.failed} failed" if s.failed else ""
        ttt = (failed or "no runs") if not s.repeats else _fmt(st["time_to_target_seconds"]) \
            if s.target_reached == s.repeats else f"not reached ({s.target_reached}/{s.repeats}{lost})"
        said = ", ".join(x for x in (f"{s.diverged} diverged" if s.diverged else "", failed) if x)
        cells = [f"`{s.variant}`", s.mode, "" if s.staleness is None else str(s.staleness),
                 f"{s.repeats} ({said})" if said else str(s.repeats),
                 _fmt(st["wall_seconds"]), _fmt(st["samples_per_second"]),
                 _lost(s, st["final_loss"]),
                 _lost(s, st["final_target_metric"], 3) if quality else _fmt(st["eval_accuracy"], 3), ttt,
                 _fmt(st["updates_applied"]), stale or _fmt(st["mean_staleness"], 3),
                 stale or _fmt(st["max_staleness"], 3), _fmt(st["wait_fraction"], 3),
                 _fmt(st["bytes_per_sample"], 3) if s.mode in MODES else "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _goodput_lines(summaries: list[VariantSummary], runs) -> list[str]:
    """The "Goodput" section: each variant with faults or stragglers against the spec's variant that is the same
    run without them (experiments/harness/goodput.py; `runs`: report_configs.stored_runs), or "none in this
    spec"; nothing where no variant has faults."""
    configs = {}
    for run in runs:
        if run.config is not None:
            configs.setdefault(run.variant, run.config)
    pairs = baselines(configs)
    stats = {s.variant: s.stats for s in summaries}
    faulty = [name for name, cfg in configs.items() if has_faults(cfg) and name in stats]
    if not faulty:
        return []
    lines = ["## Goodput", "", "Useful samples per second (the steps every shard applied, while every rank ran: "
             "docs/reliability.md, \"Goodput\") of each variant with faults or stragglers, over those of the "
             "variant that is the same run without them, repeat by repeat (the same seed); end to end, the same "
             "from the first push to the last useful step, with the tail in which the ranks that fell behind "
             "finish alone; mean ± sample std.", "",
             "| variant | without its faults | useful samples/s | goodput | end to end |", "|---|---|---|---|---|"]
    for name in faulty:
        st, base = stats[name], pairs.get(name)
        lines.append(f"| `{name}` | {f'`{base}`' if base else 'none in this spec'} | "
                     f"{_fmt(st['useful_samples_per_second'], 3)} | {_fmt(st['goodput'], 3) if base else '—'} | "
                     f"{_fmt(st['goodput_end_to_end'], 3) if base else '—'} |")
    return [*lines, ""]


def _failed_lines(out: Path, spec: ExperimentSpec) -> list[str]:
    """Each run that failed (collect.failed_repeats), with its failure in a line (error.txt's first, and its
    last where the process's last lines follow): left out of every mean, and said here."""
    notes = [f"- `{v.name}` rep-{k} (seed {spec.seeds[k]}): {cause}"
             for v in spec.variants for k, cause in failed_repeats(out, spec, v.name)]
    return ["## Failed runs", "", f"{len(notes)} run(s) failed; they are in no mean above (each folder's "
            "error.txt has the whole message):", "", *notes, ""] if notes else []


def _unrecorded_lines(runs: list[StoredRun]) -> list[str]:
    """The worker lives that died without a record (killed, then brought back: summary.json's
    faults.worker_restarts): their steps are in no samples/s, steps.csv or plot of samples seen. Said per variant,
    with the steps each had done by its progress file (every 10 steps)."""
    lives: dict[str, list[int]] = {}  # variant -> [lives, steps]
    for run in runs:
        try:
            faults = json.loads((Path(run.path) / "summary.json").read_text()).get("faults") or {}
        except (OSError, ValueError):
            continue
        dead = faults.get("worker_restarts") or []
        counts = lives.setdefault(run.variant, [0, 0])
        counts[0] += len(dead)
        counts[1] += unrecorded_steps(dead)
    notes = [f"`{variant}` {n} lives, {steps:,} steps" for variant, (n, steps) in lives.items() if n]
    return [f"samples/s counts the steps of the worker lives that wrote a record; a life killed and brought back "
            f"wrote none. Left out, over all repeats: {'; '.join(notes)}. The Goodput section's useful samples/s "
            "counts every push the shards applied, theirs too.", ""] if notes else []


def _ttt(s: VariantSummary) -> float | None:
    return s.stats["time_to_target_seconds"].mean


PerRepeat = dict[str, dict[int, dict[str, float | None]]]  # variant -> repeat -> metric -> value (runs.csv)


def per_repeat(out: Path) -> PerRepeat:
    """Every finished run's metrics, by variant and repeat, as DIR/runs.csv has them."""
    runs: PerRepeat = {}
    for row in read_csv(out / "runs.csv"):
        values = {key: number(value) for key, value in row.items()}
        runs.setdefault(row["variant"], {})[int(values["repeat"] or 0)] = values
    return runs


def _ratio(s: VariantSummary, ddp: VariantSummary, runs: PerRepeat, metric: str, mean: float | None,
           base: float | None) -> str:
    """'0.50 (0.41–0.62)': the ratio of the means, then the range of the per-repeat ratios (repeat k of
    `s` against DDP's repeat k: the same seed, run in the same round); ', inconclusive' when that range
    holds 1 (some repeats on each side of DDP)."""
    if s is ddp:
        return "1 (baseline)" if base else "—"
    if mean is None or not base:
        return "—"
    mine, theirs = runs.get(s.variant, {}), runs.get(ddp.variant, {})
    ratios = sorted(mine[k][metric] / theirs[k][metric] for k in sorted(set(mine) & set(theirs))
                    if mine[k].get(metric) is not None and theirs[k].get(metric))
    if len(ratios) < 2:
        return f"{mean / base:.2f} ({len(ratios)} paired repeat{'' if len(ratios) == 1 else 's'}: no spread)"
    lo, hi = ratios[0], ratios[-1]
    return f"{mean / base:.2f} ({lo:.2f}–{hi:.2f}{', inconclusive' if lo <= 1.0 <= hi else ''})"


def _ddp_gap(summaries: list[VariantSummary], runs: PerRepeat) -> list[str]:
    ddp = next((s for s in summaries if s.mode == "ddp"), None)
    if ddp is None:
        return ["There is no `ddp` variant in this spec, so there is no DDP gap to report."]
    if not ddp.repeats:
        return [f"The DDP baseline `{ddp.variant}` has no finished runs, so there is no DDP gap."]
    base_t, base_sps = _ttt(ddp), ddp.stats["samples_per_second"].mean
    lines = [f"Each variant against the DDP baseline `{ddp.variant}`: time to target ÷ DDP's "
             "(above 1: slower to the target) and throughput ÷ DDP's (below 1: fewer samples/s). Each ratio "
             "is the ratio of the means over repeats; in brackets, the smallest and largest per-repeat ratio "
             "(repeat k against DDP's repeat k: the same seed, run in the same round of the experiment, so "
             "under the same load). A range that holds 1 is **inconclusive**: some repeats were on each side "
             "of DDP, so the spread does not say which is faster.",
             "", "| variant | time to target s | ÷ ddp | samples/s | ÷ ddp |", "|---|---|---|---|---|"]
    for s in summaries:
        t, sps = _ttt(s), s.stats["samples_per_second"].mean
        lines.append(f"| `{s.variant}` | {_fmt(s.stats['time_to_target_seconds'], 3)} | "
                     f"{_ratio(s, ddp, runs, 'time_to_target_seconds', t, base_t)} | "
                     f"{_fmt(s.stats['samples_per_second'])} | "
                     f"{_ratio(s, ddp, runs, 'samples_per_second', sps, base_sps)} |")
    if base_t is None:
        lines += ["", f"`{ddp.variant}` did not reach the target in every repeat, so no time ratio."]
    return lines


def _ddp_gaps(summaries: list[VariantSummary], spec: ExperimentSpec, runs: PerRepeat) -> list[str]:
    """The DDP gap; with ddp variants at several worker counts, one table per count, each variant
    against the ddp variant with as many workers."""
    workers = {v.name: v.config.cluster.workers for v in spec.variants}
    counts = sorted({workers[s.variant] for s in summaries if s.mode == "ddp"})
    if len(counts) < 2:
        return _ddp_gap(summaries, runs)
    lines = []
    for n in counts:
        lines += [f"### {n} workers", "", *_ddp_gap([s for s in summaries if workers[s.variant] == n], runs), ""]
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
              "", *disagreement_section(problems), *overridden_section(runs), *skipped_lines(out, spec),
              "## Result", "", *winner_lines(summaries, target), "", *behind_lines(summaries, runs),
              "## DDP gap", "",
              *_ddp_gaps(summaries, spec, per_repeat(out)), "", "## Summary", "",
              "Mean ± sample std over repeats (summary.csv has every value; "
              "docs/experiments.md defines each column).", "", *_table(summaries, spec.target.metric), "",
              *_unrecorded_lines(runs),
              *_failed_lines(out, spec), *_goodput_lines(summaries, runs), *regions_lines(runs), *traffic_lines(spec, summaries),
              "## Plots", ""]
    for caption, rel in plots:
        lines += [f"### {caption}", "", f"![{caption}]({rel})", ""]
    lines += command_lines(runs, spec)
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    log.info("report: wrote %s", path)
    return path
