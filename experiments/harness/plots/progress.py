"""Learning curves on fair axes: held-out metrics and training loss against samples seen (all workers),
updates applied (the servers' update count; all-reduce applies one per step) and wall time.

Samples seen at an evaluation are the batch sizes of every worker step logged before it; updates applied
there are the run's final update count (summary.json) times the share of its pushes logged before it,
exact for async and ssp (one update per push) and for sync and all-reduce at a step boundary."""
from __future__ import annotations

import math
from bisect import bisect_right
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import EngFormatter

from psrv.experiments.harness.collect import number
from psrv.experiments.harness.plots.figure import Rows, VariantData, color, figure, legend, pushed, save, style

AXES = (("samples", "samples seen (all workers)"), ("updates", "updates applied (servers' count)"),
        ("wall_time", "wall time (s)"))


class Progress:
    """For one run: samples seen and updates applied at any wall time, from its step log."""

    def __init__(self, steps: Rows, updates: float):
        self.times = [number(r.get("wall_time")) or 0.0 for r in steps]
        self.cum_samples = np.cumsum([number(r.get("batch_size")) or 0.0 for r in steps]).tolist()
        self.cum_pushes = np.cumsum([pushed(r) for r in steps]).tolist()  # local steps: every H-th pushes
        self.updates_per_push = updates / self.cum_pushes[-1] if steps and self.cum_pushes[-1] else 0.0

    def at(self, t: float) -> dict[str, float]:
        n = bisect_right(self.times, t)
        return {"samples": self.cum_samples[n - 1] if n else 0.0,
                "updates": (self.cum_pushes[n - 1] if n else 0) * self.updates_per_push, "wall_time": t}


def _eval_points(v: VariantData, y: str) -> dict[int, list[dict[str, float]]]:
    """repeat -> one point per evaluation (x axes and y), in step order; rows without y dropped."""
    out = {}
    for rep in v.repeats():
        prog = Progress(v.steps_of(rep), v.updates.get(rep, 0.0))
        points = []
        for row in sorted(v.evals_of(rep), key=lambda r: number(r.get("step")) or 0.0):
            t, value = number(row.get("wall_time")), number(row.get(y))
            if t is not None and value is not None:
                points.append({**prog.at(t), "y": value})
        if points:
            out[rep] = points
    return out


def _train_points(v: VariantData) -> dict[int, list[dict[str, float]]]:
    """repeat -> the training loss, a moving mean over ~1/30 of the steps, at each logged step."""
    out = {}
    for rep in v.repeats():
        rows = [r for r in v.steps_of(rep) if number(r.get("loss")) is not None]
        if not rows:
            continue
        prog = Progress(v.steps_of(rep), v.updates.get(rep, 0.0))
        loss = np.array([number(r["loss"]) for r in rows])
        k = max(1, len(loss) // 30)
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        times = [number(r.get("wall_time")) or 0.0 for r in rows][k - 1:]
        out[rep] = [{**prog.at(t), "y": float(y)} for t, y in zip(times, smooth)]
    return out


def _draw(ax: Axes, i: int, name: str, runs: dict[int, list[dict[str, float]]], x: str, *,
          markers: bool) -> None:
    if not runs:
        return
    if len(runs) > 1:
        for points in runs.values():
            ax.plot([p[x] for p in points], [p["y"] for p in points], color=color(i), alpha=0.3,
                    linewidth=0.8, linestyle=style(i))
    n = min(len(p) for p in runs.values())  # the mean over repeats, point by point (same eval steps)
    xs = np.mean([[p[x] for p in pts[:n]] for pts in runs.values()], axis=0)
    ys = np.mean([[p["y"] for p in pts[:n]] for pts in runs.values()], axis=0)
    # a NaN or Inf (a collapsed model's perplexity) is not drawn: the legend says so, or the variant looks absent
    lost = not all(math.isfinite(p["y"]) for pts in runs.values() for p in pts)
    ax.plot(xs, ys, color=color(i), linewidth=1.8, linestyle=style(i),
            label=f"{name} (not finite: not drawn there)" if lost else name,
            marker="o" if markers else None, markersize=2.5)


def _finish(ax: Axes, xlabel: str, ylabel: str, target: float | None) -> None:
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    shown = [v for line in ax.get_lines() for v in line.get_ydata()]
    if shown and min(shown) > 0 and max(shown) / min(shown) > 30:  # perplexity from ~300 to ~8
        ax.set_yscale("log")
        ylabel += " (log)"
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 20k, not 20000 run into its neighbour
    ax.grid(alpha=0.3)


def plot_metric(path: Path, data: list[VariantData], *, y: str, ylabel: str, target: float | None,
                train_loss: bool) -> None:
    """One row of three panels (samples, updates, wall time) for held-out `y`; a second row for the
    training loss when `train_loss`."""
    rows = 2 if train_loss else 1
    fig, axes = figure(rows, 3, width=14.0, height=4.0 * rows)
    several = any(len(v.repeats()) > 1 for v in data)
    for i, v in enumerate(data):
        evals = _eval_points(v, y)
        train = _train_points(v) if train_loss else {}
        for col, (x, _) in enumerate(AXES):
            _draw(axes[col], i, v.name, evals, x, markers=True)
            if train_loss:
                _draw(axes[3 + col], i, v.name, train, x, markers=False)
    for col, (_, xlabel) in enumerate(AXES):
        _finish(axes[col], xlabel, f"held-out {ylabel}", target)
        if train_loss:
            _finish(axes[3 + col], xlabel, "training loss (moving mean)", None)
    if axes[0].has_data():
        legend(fig, axes[0])
    note = " (thin: each repeat; thick: mean over repeats)" if several else ""
    fig.suptitle(f"Held-out {ylabel}" + (" (top) and training loss (bottom)" if train_loss else "")
                 + " against samples seen, updates applied and wall time" + note, fontsize="medium")
    save(fig, path)
