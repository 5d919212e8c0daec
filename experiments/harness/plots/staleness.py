"""Staleness and clock gap, for the modes that have a spread of them (async, ssp, sync's quorum merges): their
distributions over every repeat, and staleness over wall time. sync's barrier (always 0) and all-reduce (none) get
no panel.

Staleness is each push's, as the worker's step log records it (the servers' version when applied minus
the version it read); with local steps only the rows that pushed count (steps.csv's `pushed`), as
summary.json's mean_staleness counts them. The clock gap at a push is that worker's clock (its pushes so
far) minus the slowest worker's at the moment it pushed, from the step log's wall times."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from psrv.experiments.harness.collect import number
from psrv.experiments.harness.plots.figure import VariantData, color, figure, has_staleness, legend, pushed, save


def staleness_values(v: VariantData) -> list[float]:
    """Every push's staleness, over all repeats (a local step that pushed nothing has none)."""
    return [s for s in (number(r.get("staleness")) for r in v.steps if pushed(r)) if s is not None]


def clock_gaps(v: VariantData) -> list[int]:
    """Every push's clock gap, over all repeats."""
    gaps = []
    for rep in v.repeats():
        rows = [r for r in v.steps_of(rep) if pushed(r)]
        clocks = {int(number(r.get("worker")) or 0): 0 for r in rows}
        for row in rows:
            w = int(number(row.get("worker")) or 0)
            clocks[w] += 1
            gaps.append(clocks[w] - min(clocks.values()))
    return gaps


def _bars(ax, values: list[float], i: int, xlabel: str) -> None:
    top = int(max(values))
    ax.hist(values, bins=[b - 0.5 for b in range(top + 2)], color=color(i), rwidth=0.85)
    ax.set_xticks(range(0, top + 1, max(1, -(-(top + 1) // 8))))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("pushes")


def plot_distributions(path: Path, data: list[VariantData]) -> bool:
    """Staleness (top row) and clock gap (bottom row) histograms; False (nothing written) if no variant
    has them."""
    shown = [(i, v) for i, v in enumerate(data) if has_staleness(v) and staleness_values(v)]
    if not shown:
        return False
    fig, axes = figure(2, len(shown), width=3.6 * len(shown), height=5.6)
    for col, (i, v) in enumerate(shown):
        top, bottom = axes[col], axes[len(shown) + col]
        _bars(top, staleness_values(v), i, "staleness (versions)")
        top.set_title(v.name, fontsize="medium")
        _bars(bottom, clock_gaps(v), i, "clock gap (pushes ahead of the slowest)")
    fig.suptitle("Staleness of each push (top) and clock gap at each push (bottom), all repeats;\n"
                 "sync's barrier and all-reduce have none to show", fontsize="medium")  # two lines: fits two panels
    save(fig, path)
    return True


def plot_over_time(path: Path, data: list[VariantData], *, bins: int = 30) -> bool:
    """Mean staleness in `bins` slices of wall time, per variant with staleness; False if none."""
    fig, (ax,) = figure()
    for i, v in enumerate(data):
        if not has_staleness(v):
            continue
        points = [(number(r.get("wall_time")), number(r.get("staleness"))) for r in v.steps if pushed(r)]
        points = [(t, s) for t, s in points if t is not None and s is not None]
        if not points:
            continue
        t, s = np.array(points).T
        edges = np.linspace(0.0, t.max(), bins + 1)
        which = np.clip(np.digitize(t, edges) - 1, 0, bins - 1)
        # a slice with few pushes (the end, where one worker is left) is noise, not a trend: left out
        enough = max(3, len(t) // (5 * bins))
        kept = [b for b in range(bins) if (which == b).sum() >= enough]
        xs = [(edges[b] + edges[b + 1]) / 2 for b in kept]
        ys = [s[which == b].mean() for b in kept]
        ax.plot(xs, ys, color=color(i), marker="o", markersize=2.5, label=v.name)
    if not ax.has_data():
        return False
    ax.set_title(f"Mean staleness over wall time ({bins} slices, all repeats; sparse slices left out)",
                 fontsize="medium")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("mean staleness (versions)")
    ax.grid(alpha=0.3)
    legend(fig, ax)
    save(fig, path)
    return True
