"""The busiest process's measured traffic per training step, and the time per step, against the number of
workers: one line per variant, where variants that differ in nothing but the number of workers (a sweep
over N, as placement.toml's cpu-1server-2w, -4w, -8w) are one line's points."""
from __future__ import annotations

from pathlib import Path

from psrv.experiments.harness.collect import VariantSummary
from psrv.experiments.harness.plots.figure import color, figure, legend, save
from psrv.experiments.launcher.provenance import OUTPUT_KEYS, flat
from psrv.experiments.harness.spec import ExperimentSpec


def architecture(cfg) -> str:
    """'1 server on cpu (sync)', '4 servers on cuda:0 (sync)' or 'ddp (per rank)'."""
    if cfg.is_allreduce:
        return f"{cfg.mode} all-reduce (per rank)"
    n = cfg.cluster.servers
    return f"{n} server{'s' if n > 1 else ''} on {cfg.cluster.device} ({cfg.mode})"


PANELS = (("busiest_bytes_in_per_step", "bytes in per step (busiest process)", 1 / 1024, "KiB"),
          ("busiest_bytes_out_per_step", "bytes out per step (busiest process)", 1 / 1024, "KiB"),
          ("seconds_per_step", "time per step", 1000.0, "ms"))


def traffic_lines(spec: ExperimentSpec, summaries: list[VariantSummary]) -> dict[str, list[tuple[int, VariantSummary]]]:
    """{label: [(workers, summary) by workers]} of the variants with a measured traffic, one line each. A
    line joins only variants whose configs differ in nothing but cluster.workers (each N once); the label is
    the architecture, followed by the line's variant names where another line shares that architecture."""
    by_name = {s.variant: s for s in summaries}
    series: list[tuple[dict, list]] = []  # (config without the worker count, [(workers, name, summary)])
    for v in spec.variants:
        s = by_name.get(v.name)
        if s is None or s.stats["busiest_bytes_in_per_step"].mean is None:
            continue
        n = v.config.cluster.workers
        setting = {k: x for k, x in flat(v.config).items() if k != "cluster.workers" and k not in OUTPUT_KEYS}
        line = next((pts for key, pts in series if key == setting and n not in (p[0] for p in pts)), None)
        if line is None:
            series.append((setting, line := []))
        line.append((n, v.name, s))
    arch = [architecture(spec.variant(pts[0][1]).config) for _, pts in series]
    out = {}
    for a, (_, pts) in zip(arch, series):
        label = a if arch.count(a) == 1 else f"{a}: {', '.join(name for _, name, _ in pts)}"
        out[label] = sorted(((n, s) for n, _, s in pts), key=lambda p: p[0])
    return out


def plot_traffic(path: Path, spec: ExperimentSpec, summaries: list[VariantSummary]) -> bool:
    """False (nothing written) when no variant has a measured traffic."""
    lines = traffic_lines(spec, summaries)
    if not lines:
        return False
    fig, axes = figure(1, 3, width=15.0, height=4.3)
    for ax, (metric, title, scale, unit) in zip(axes, PANELS):
        for i, (label, points) in enumerate(lines.items()):  # in spec order, as the other plots
            ax.errorbar([n for n, _ in points], [s.stats[metric].mean * scale for _, s in points],
                        yerr=[(s.stats[metric].std or 0.0) * scale for _, s in points], color=color(i),
                        marker="o", capsize=3, label=label)
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel("workers N")
        ax.set_ylabel(unit)
        ax.set_xticks(sorted({n for pts in lines.values() for n, _ in pts}))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    legend(fig, axes[0])
    fig.suptitle("Measured traffic of the busiest process per training step (one step of every worker), "
                 "mean ± std over repeats", fontsize="medium")
    save(fig, path)
    return True
