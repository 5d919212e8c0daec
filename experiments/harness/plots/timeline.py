"""The per-worker step timeline: each worker's completed steps against wall time, one panel per variant
(its first repeat). A straggler is the flatter line; under sync every line is held to the slowest."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from psrv.experiments.harness.collect import number
from psrv.experiments.harness.plots.figure import VariantData, figure, save


def plot_timeline(path: Path, data: list[VariantData]) -> bool:
    """False (nothing written) when no variant has a finished run; a variant without one gets no panel."""
    data = [v for v in data if v.steps]
    if not data:
        return False
    ncols = min(len(data), 3)
    nrows = -(-len(data) // ncols)
    fig, axes = figure(nrows, ncols, width=4.2 * ncols, height=3.0 * nrows)
    for ax, v in zip(axes, data):
        reps = v.repeats()
        by_worker: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for row in v.steps_of(reps[0]):
            t, w, s = number(row.get("wall_time")), number(row.get("worker")), number(row.get("step"))
            if t is not None and w is not None and s is not None:
                by_worker[int(w)].append((t, s + 1))
        for w, points in sorted(by_worker.items()):
            ax.plot([p[0] for p in points], [p[1] for p in points], linewidth=1.2, label=f"worker {w}",
                    drawstyle="steps-post")
        ax.set_title(f"{v.name} (repeat {reps[0]})", fontsize="medium")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("steps done")
        ax.grid(alpha=0.3)
        if len(by_worker) <= 8 and ax.has_data():
            ax.legend(fontsize="x-small")
    for ax in axes[len(data):]:
        ax.set_visible(False)
    fig.suptitle("Each worker's steps against wall time (a straggler is the flatter line)", fontsize="medium")
    save(fig, path)
    return True
