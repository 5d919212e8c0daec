"""The busiest process's measured traffic per training step, and the time per step, against the number of
workers: one line per architecture (a server's placement and shard count, or an all-reduce mode)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from experiments.collect import VariantSummary
from experiments.plots.figure import color, figure, save
from experiments.spec import ExperimentSpec


def architecture(cfg) -> str:
    """'1 server on cpu (sync)', '4 servers on cuda:0 (sync)' or 'ddp (per rank)'."""
    if cfg.is_allreduce:
        return f"{cfg.mode} all-reduce (per rank)"
    n = cfg.cluster.servers
    return f"{n} server{'s' if n > 1 else ''} on {cfg.cluster.device} ({cfg.mode})"


PANELS = (("busiest_bytes_in_per_step", "bytes in per step (busiest process)", 1 / 1024, "KiB"),
          ("busiest_bytes_out_per_step", "bytes out per step (busiest process)", 1 / 1024, "KiB"),
          ("seconds_per_step", "time per step", 1000.0, "ms"))


def plot_traffic(path: Path, spec: ExperimentSpec, summaries: list[VariantSummary]) -> bool:
    """False (nothing written) when no variant has a measured traffic."""
    by_name = {s.variant: s for s in summaries}
    lines: dict[str, list[tuple[int, VariantSummary]]] = defaultdict(list)
    for v in spec.variants:
        s = by_name.get(v.name)
        if s is not None and s.stats["busiest_bytes_in_per_step"].mean is not None:
            lines[architecture(v.config)].append((v.config.cluster.workers, s))
    if not lines:
        return False
    fig, axes = figure(1, 3, width=15.0, height=4.3)
    for ax, (metric, title, scale, unit) in zip(axes, PANELS):
        for i, (label, points) in enumerate(sorted(lines.items())):
            points.sort(key=lambda p: p[0])
            ax.errorbar([n for n, _ in points], [s.stats[metric].mean * scale for _, s in points],
                        yerr=[(s.stats[metric].std or 0.0) * scale for _, s in points], color=color(i),
                        marker="o", capsize=3, label=label)
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel("workers N")
        ax.set_ylabel(unit)
        ax.set_xticks(sorted({n for pts in lines.values() for n, _ in pts}))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle("Measured traffic of the busiest process per training step (one step of every worker), "
                 "mean ± std over repeats", fontsize="medium")
    save(fig, path)
    return True
