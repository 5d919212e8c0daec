"""Plots (PNG, matplotlib Agg) and DIR/report.md for an experiment that collect.py has collected."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.collect import Stat, VariantSummary, number, read_csv, read_summary
from experiments.report_configs import (command_lines, disagreement_section, disagreements,
                                        mixed_folder_lines, setup_lines, stored_runs)
from experiments.spec import ExperimentSpec

log = logging.getLogger(__name__)

Rows = list[dict[str, str]]
_PHASES = (("compute_seconds", "compute"), ("communication_seconds", "communication"),
           ("wait_seconds", "wait (barrier / SSP)"))


def _figure(nrows: int = 1, ncols: int = 1, *, width: float = 7.5,
            height: float = 4.5) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # render with Agg whatever pyplot's backend is
    return fig, list(fig.subplots(nrows, ncols, squeeze=False).flat)


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=110)
    log.info("report: wrote %s", path)


def _series(rows: Rows, x: str, y: str) -> dict[int, list[tuple[float, float, float]]]:
    """repeat -> [(step, x, y)] sorted by step, rows with a missing value dropped."""
    out: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for row in rows:
        step, xv, yv = number(row.get("step")), number(row.get(x)), number(row.get(y))
        if step is not None and xv is not None and yv is not None:
            out[int(number(row.get("repeat")) or 0)].append((step, xv, yv))
    return {rep: sorted(points) for rep, points in out.items()}


def _mean_curve(series: dict[int, list[tuple[float, float, float]]]) -> tuple[list, list]:
    """Mean x and y over repeats at each eval step that every repeat has."""
    by_step: dict[float, list[tuple[float, float]]] = defaultdict(list)
    for points in series.values():
        for step, xv, yv in points:
            by_step[step].append((xv, yv))
    steps = sorted(s for s, pts in by_step.items() if len(pts) == len(series))
    return ([sum(p[0] for p in by_step[s]) / len(series) for s in steps],
            [sum(p[1] for p in by_step[s]) / len(series) for s in steps])


def _plot_curves(path: Path, evals: dict[str, Rows], *, x: str, y: str, xlabel: str,
                 ylabel: str, target: float | None, title: str) -> None:
    fig, (ax,) = _figure()
    repeats = 1
    for i, (name, rows) in enumerate(evals.items()):
        series = _series(rows, x, y)
        if not series:
            continue
        color, repeats = f"C{i % 10}", max(repeats, len(series))
        style = ("-", "--", "-.", ":")[i % 4]  # lines that coincide (sync and ddp) stay visible
        if len(series) > 1:  # each repeat thinly, the mean over repeats on top
            for points in series.values():
                ax.plot([p[1] for p in points], [p[2] for p in points], color=color,
                        alpha=0.3, linewidth=0.8, linestyle=style)
        xs, ys = _mean_curve(series)
        ax.plot(xs, ys, color=color, linewidth=1.8, marker="o", markersize=2.5, label=name,
                linestyle=style)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    shown = [v for line in ax.get_lines() for v in line.get_ydata()]
    if shown and min(shown) > 0 and max(shown) / min(shown) > 30:  # perplexity from ~300 to ~8
        ax.set_yscale("log")  # a linear axis would flatten everything after the first evaluation
        ylabel += " (log scale)"
    note = " (thin: each repeat; thick: mean over repeats)" if repeats > 1 else ""
    ax.set_title(title + note, fontsize="medium")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize="small")
    _save(fig, path)


def _plot_throughput(path: Path, summaries: list[VariantSummary]) -> None:
    fig, (ax,) = _figure()
    stats = [s.stats["samples_per_second"] for s in summaries]
    ax.bar([s.variant for s in summaries], [st.mean or 0.0 for st in stats],
           yerr=[st.std or 0.0 for st in stats], capsize=4,
           color=[f"C{i % 10}" for i in range(len(summaries))])
    ax.set_title("Throughput (error bars: std over repeats)", fontsize="medium")
    ax.set_ylabel("samples / s, all workers")
    ax.tick_params(axis="x", labelrotation=30)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def _plot_staleness(path: Path, steps: dict[str, Rows], modes: dict[str, str]) -> None:
    ncols = min(len(steps), 3)
    nrows = -(-len(steps) // ncols)
    fig, axes = _figure(nrows, ncols, width=3.6 * ncols, height=2.8 * nrows)
    for i, (ax, (name, rows)) in enumerate(zip(axes, steps.items())):
        values = [v for v in (number(row.get("staleness")) for row in rows) if v is not None]
        ax.set_title(name, fontsize="medium")
        if modes[name] == "ddp":  # no bar at 0: all-reduce has no staleness to measure
            ax.text(0.5, 0.5, "n/a: all-reduce has no staleness", ha="center", va="center",
                    transform=ax.transAxes)
        elif values:
            top = int(max(values))
            ax.hist(values, bins=[b - 0.5 for b in range(top + 2)], color=f"C{i % 10}",
                    rwidth=0.85)
            ax.set_xticks(range(0, top + 1, max(1, -(-(top + 1) // 8))))
        else:
            ax.text(0.5, 0.5, "no staleness recorded", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_xlabel("staleness (versions)")
        ax.set_ylabel("worker steps")
    for ax in axes[len(steps):]:
        ax.set_visible(False)
    fig.suptitle("Staleness of each worker step (all repeats)", fontsize="medium")
    _save(fig, path)


def _plot_breakdown(path: Path, steps: dict[str, Rows]) -> None:
    fig, (ax,) = _figure()
    names = list(steps)
    bottom = [0.0] * len(names)
    for j, (column, label) in enumerate(_PHASES):
        means = []
        for rows in steps.values():
            values = [v for v in (number(row.get(column)) for row in rows) if v is not None]
            means.append(sum(values) / len(values) if values else 0.0)
        ax.bar(names, means, bottom=bottom, label=label, color=f"C{j}")
        bottom = [b + m for b, m in zip(bottom, means)]
    ax.set_title("Mean time per worker step", fontsize="medium")
    ax.set_ylabel("seconds")
    ax.tick_params(axis="x", labelrotation=30)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    _save(fig, path)


def write_plots(out_dir: str | Path, spec: ExperimentSpec,
                summaries: list[VariantSummary]) -> list[tuple[str, str]]:
    """Write DIR/plots/*.png; returns (caption, path relative to DIR) for each."""
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    evals = {v.name: read_csv(out / v.name / "evals.csv") for v in spec.variants}
    steps = {v.name: read_csv(out / v.name / "steps.csv") for v in spec.variants}
    # the third curve: the target's metric where it names one (perplexity, ...), else accuracy
    shown = spec.target.metric or "accuracy"
    plots = [("Eval loss vs wall time", "plots/eval_loss_vs_time.png"),
             ("Eval loss vs step (rank 0's step)", "plots/eval_loss_vs_step.png"),
             (f"Eval {shown} vs wall time", f"plots/eval_{shown}_vs_time.png"),
             ("Throughput", "plots/throughput.png"),
             ("Staleness of each worker step", "plots/staleness.png"),
             ("Where a worker step's time goes", "plots/time_breakdown.png")]
    paths = [out / rel for _, rel in plots]
    loss = spec.target.eval_loss
    third = spec.target.value if spec.target.metric else spec.target.eval_accuracy
    curves = [("wall_time", "eval_loss", "wall time (s)", "held-out loss", loss),
              ("step", "eval_loss", "step (rank 0)", "held-out loss", loss),
              ("wall_time", f"eval_{shown}", "wall time (s)", f"held-out {shown}", third)]
    for (x, y, xlabel, ylabel, target), path, (title, _) in zip(curves, paths, plots):
        _plot_curves(path, evals, x=x, y=y, xlabel=xlabel, ylabel=ylabel, target=target,
                     title=title)
    _plot_throughput(paths[3], summaries)
    _plot_staleness(paths[4], steps, {v.name: v.mode for v in spec.variants})
    _plot_breakdown(paths[5], steps)
    return plots


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
        stale = "n/a" if s.mode == "ddp" else None  # DDP has no staleness, not a staleness of 0
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


def _winner(summaries: list[VariantSummary], target: str) -> list[str]:
    reached = sorted((s for s in summaries if _ttt(s) is not None), key=lambda s: _ttt(s))
    missed = [f"`{s.variant}` ({s.target_reached}/{s.repeats} repeats)"
              for s in summaries if _ttt(s) is None and s.repeats]
    empty = [f"`{s.variant}`" for s in summaries if not s.repeats]
    tail = [f"No finished runs: {', '.join(empty)}."] if empty else []
    if not reached:
        return [" ".join([f"No variant reached the target ({target}) in every repeat.", *tail])]
    best = reached[0]
    lines = [f"`{best.variant}` reached the target ({target}) first in wall time: "
             f"{_ttt(best):.3g} s (mean over {best.repeats} repeat(s))."]
    if len(reached) > 1:
        lines.append("Order: " + ", ".join(f"`{s.variant}` {_ttt(s):.3g} s" for s in reached) + ".")
    if missed:
        lines.append("Did not reach it in every repeat: " + ", ".join(missed) + ".")
    return [" ".join(lines + tail)]


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
              "", *disagreement_section(problems), "## Result", "", *_winner(summaries, target), "",
              "## DDP gap", "",
              *_ddp_gap(summaries), "", "## Summary", "",
              "Mean ± sample std over repeats (summary.csv has every value; "
              "docs/experiments.md defines each column).", "", *_table(summaries, spec.target.metric), "", "## Plots", ""]
    for caption, rel in plots:
        lines += [f"### {caption}", "", f"![{caption}]({rel})", ""]
    lines += command_lines(runs, spec)
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    log.info("report: wrote %s", path)
    return path
