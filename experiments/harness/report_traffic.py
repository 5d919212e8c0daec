"""The report's lines on placement: the variants skipped on this machine and why, and the measured traffic
of each variant's busiest process per training step (experiments/harness/traffic.py says how it is measured)."""
from __future__ import annotations

from pathlib import Path

from psrv.experiments.harness.collect import SKIPPED_FILE, Stat, VariantSummary
from psrv.experiments.harness.plots.traffic import architecture
from psrv.experiments.harness.spec import ExperimentSpec
from psrv.experiments.harness.traffic import METHOD


def skipped_lines(out: Path, spec: ExperimentSpec) -> list[str]:
    notes = []
    for v in spec.variants:
        path = out / v.name / SKIPPED_FILE
        if path.exists():
            notes.append(f"- `{v.name}` was skipped here: {path.read_text().strip()}")
    return ["## Skipped on this machine", "", *notes, ""] if notes else []


def _kib(stat: Stat) -> str:
    if stat.mean is None:
        return "—"
    return f"{stat.mean / 1024:.1f}" + (f" ± {stat.std / 1024:.1f}" if stat.std is not None else "")


def _ms(stat: Stat) -> str:
    if stat.mean is None:
        return "—"
    return f"{stat.mean * 1000:.1f}" + (f" ± {stat.std * 1000:.1f}" if stat.std is not None else "")


def traffic_lines(spec: ExperimentSpec, summaries: list[VariantSummary]) -> list[str]:
    """The traffic table, every variant a row (one not measured says so), or nothing when no variant has a
    measured traffic."""
    by_name = {s.variant: s for s in summaries}
    rows = []
    for v in spec.variants:
        s = by_name.get(v.name)
        if s is None or not s.repeats:
            rows.append(f"| `{v.name}` | {architecture(v.config)} | {v.config.cluster.workers} | no finished run "
                        "| | | | 0 |")
            continue
        st = s.stats
        if st["busiest_bytes_in_per_step"].mean is None:
            rows.append(f"| `{v.name}` | {architecture(v.config)} | {v.config.cluster.workers} | not measured (no "
                        f"traffic.json: `ss` absent, or a scheduler's run) | | | {_ms(st['seconds_per_step'])} | "
                        f"{s.repeats} |")
            continue
        rows.append(f"| `{v.name}` | {architecture(v.config)} | {v.config.cluster.workers} | "
                    f"{_kib(st['busiest_bytes_in_per_step'])} | {_kib(st['busiest_bytes_out_per_step'])} | "
                    f"{_kib(st['server_own_bytes_per_step'])} | "
                    f"{_ms(st['seconds_per_step'])} | {s.repeats} |")
    if all("| not measured" in r or "| no finished run" in r for r in rows):
        return []
    return ["## Traffic of the busiest process", "",
            "Per training step (one step of every worker), mean ± std over repeats, for the busiest process: "
            "the server (parameter server) or the rank (all-reduce) that moved the most bytes. Measured with "
            + METHOD.format(interval=0.2) + ". The server's own count (server-K.json: the bytes of every "
            "message it received and sent, in + out, over the whole run, the start included, ÷ steps) is a "
            "cross-check. Time per step: the run's wall time ÷ its steps.", "",
            "| variant | architecture | workers | KiB in / step | KiB out / step | server's own count, KiB in + out "
            "/ step | ms / step | repeats |",
            "|---|---|---|---|---|---|---|---|", *rows, ""]
