"""Throughput per variant, and where a worker step's time goes: compute, communication, and waiting
(sync's barrier, SSP's bound, an all-reduce rank's wait for the slowest) as each step log records it."""
from __future__ import annotations

from pathlib import Path

from psrv.experiments.harness.collect import VariantSummary, number
from psrv.experiments.harness.plots.figure import VariantData, color, figure, has_staleness, save

PHASES = (("compute_seconds", "compute"), ("communication_seconds", "communication"),
          ("wait_seconds", "waiting (barrier, SSP bound, slowest rank)"))


def plot_throughput(path: Path, summaries: list[VariantSummary]) -> None:
    fig, (ax,) = figure()
    stats = [s.stats["samples_per_second"] for s in summaries]
    ax.bar([s.variant for s in summaries], [st.mean or 0.0 for st in stats],
           yerr=[st.std or 0.0 for st in stats], capsize=4, color=[color(i) for i in range(len(summaries))])
    ax.set_title("Throughput (error bars: std over repeats)", fontsize="medium")
    ax.set_ylabel("samples / s, all workers")
    ax.tick_params(axis="x", labelrotation=30)
    ax.grid(axis="y", alpha=0.3)
    save(fig, path)


def phase_means(v: VariantData) -> dict[str, float]:
    """Mean seconds per worker step of each phase, over every worker and repeat."""
    out = {}
    for column, _ in PHASES:
        values = [x for x in (number(r.get(column)) for r in v.steps) if x is not None]
        out[column] = sum(values) / len(values) if values else 0.0
    return out


def plot_breakdown(path: Path, data: list[VariantData]) -> None:
    fig, (ax,) = figure()
    names = [v.name for v in data]
    means = [phase_means(v) for v in data]
    bottom = [0.0] * len(data)
    for j, (column, label) in enumerate(PHASES):
        heights = [m[column] for m in means]
        ax.bar(names, heights, bottom=bottom, label=label, color=f"C{j}")
        bottom = [b + h for b, h in zip(bottom, heights)]
    for k, (v, m) in enumerate(zip(data, means)):
        if not v.steps:
            ax.annotate("no runs", (k, 0), ha="center", va="bottom", fontsize="x-small")
        elif not has_staleness(v) and v.mode != "sync" and m["wait_seconds"] == 0.0 and v.steps:
            # an all-reduce rank that logs no wait: its wait for the slowest rank is inside communication
            ax.annotate("wait not logged:\nin communication", (k, bottom[k]), ha="center", va="bottom",
                        fontsize="x-small")
    ax.set_title("Mean time per worker step (all workers and repeats)", fontsize="medium")
    ax.set_ylabel("seconds")
    ax.tick_params(axis="x", labelrotation=30)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)  # off the bars
    save(fig, path)
