"""A simulation spec: one TOML file with a run's keys (the config tree's, [simulate] among them), the
worker counts to sweep and the variants to compare; `psrv simulate --spec FILE` simulates every variant
at every N into DIR/<variant>/N-<n>/ and writes DIR/summary.csv, DIR/report.md and DIR/plots.

Beside the tree's keys a spec has `name`, `description`, `workers` (the Ns) and, in a variant,
`backup_fraction` (backup workers as a fraction of N, rounded down: a count cannot follow N)."""
from __future__ import annotations

import csv
import json
import tomllib
from pathlib import Path

from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.run import simulate
from psrv.config import from_dict, merge

COLUMNS = ("variant", "workers", "mode", "staleness", "backup_workers", "samples_per_second", "wait_fraction",
           "mean_staleness", "max_staleness", "max_clock_gap", "dropped", "wall_seconds", "simulator_seconds",
           "failures", "shard_failures", "lost_samples", "useful_samples_per_second_end_to_end", "goodput_end_to_end",
           "goodput", "diverged", "diverged_why")  # diverged: learning level only (docs/simulator.md)
_SPEC_KEYS = ("name", "description", "workers", "variants")
FRACTIONS = ("backup_fraction", "quorum_fraction")  # a variant's settings given as a share of N
GOODPUT = (("goodput", "goodput while every rank ran"), ("goodput_end_to_end", "goodput end to end"))


def load(path: str | Path) -> tuple[dict, list[tuple[str, int, SimulationConfig]]]:
    """The spec's header and every (variant, N, config) it asks for; ValueError naming what is wrong."""
    raw = tomllib.loads(Path(path).read_text())
    ns, variants = raw.get("workers"), raw.get("variants")
    if not ns or not all(isinstance(n, int) and n > 0 for n in ns):
        raise ValueError(f"{path}: `workers` must list the worker counts to simulate, e.g. [16, 64, 256, 1024]")
    if not variants:
        raise ValueError(f"{path}: give at least one [[variants]] table with a name")
    base = {k: v for k, v in raw.items() if k not in _SPEC_KEYS}
    runs = []
    for variant in variants:
        name = variant.get("name")
        if not name:
            raise ValueError(f"{path}: every [[variants]] table needs a name")
        keys = {k: v for k, v in variant.items() if k not in ("name", *FRACTIONS)}
        for n in ns:
            over = {"cluster": {"workers": n}}
            if "backup_fraction" in variant:
                over["backup_workers"] = int(variant["backup_fraction"] * n)
            if "quorum_fraction" in variant:  # a quorum that grows with N: Q = round(f x N), at least 1
                f = variant["quorum_fraction"]
                if not isinstance(f, (int, float)) or not 0 < f <= 1:
                    raise ValueError(f"{path}: variant {name}: quorum_fraction must be in (0, 1]; got {f!r}")
                over["quorum"] = max(1, round(f * n))
            try:
                runs.append((name, n, from_dict(SimulationConfig, merge(merge(base, keys), over))))
            except ValueError as exc:
                raise ValueError(f"{path}: variant {name} at N={n}: {exc}") from None
    return {k: raw.get(k) for k in ("name", "description")} | {"workers": ns}, runs


def run_spec(path: str | Path, *, out: str | Path) -> list[dict]:
    """Simulate every run of the spec at `path` into `out`; return summary.csv's rows."""
    header, runs = load(path)
    out = Path(out)
    rows = []
    for name, n, cfg in runs:
        summary = simulate(cfg, out=out / name / f"N-{n}")
        rows.append({"variant": name, "workers": n, **{k: summary[k] for k in COLUMNS[2:]}})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    write_report(out, header, rows, spec_path=Path(path), example=runs[0][2])
    return rows


def write_report(out: Path, header: dict, rows: list[dict], *, spec_path: Path, example: SimulationConfig) -> None:
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    sim = example.simulate
    lines = [f"# {header['name']} (simulated)", "", header.get("description") or "", "",
             f"Every number here is simulated (`psrv simulate --spec {spec_path}`): psrv's controllers driven by "
             f"modelled time, not a real run. Job {example.job.name}, {example.job.steps} steps per worker, "
             f"{example.cluster.servers} shards; compute {sim.compute} (model {sim.model_ms} ms + "
             f"{example.faults.compute_ms} ms" + (f", sigma {sim.sigma}" if sim.compute == "lognormal" else "")
             + f"), latency {sim.latency_ms} ms, {sim.bandwidth_gbps} Gbit/s links.", ""]
    for metric, label in (("samples_per_second", "samples/s"), ("wait_fraction", "wait fraction"),
                          ("mean_staleness", "mean staleness"), ("max_clock_gap", "max clock gap"),
                          *_goodput_metrics(rows)):
        lines += [f"## {label}", "", "| variant | " + " | ".join(f"N={n}" for n in header["workers"]) + " |",
                  "|---|" + "---:|" * len(header["workers"])]
        for v in variants:
            cells = {r["workers"]: r[metric] for r in rows if r["variant"] == v}
            lines.append(f"| {v} | " + " | ".join(_fmt(cells.get(n)) for n in header["workers"]) + " |")
        lines.append("")
    diverged = [r for r in rows if r["diverged"]]
    if diverged:  # the learning level: a run whose training diverged says so, and why
        lines += ["## Diverged", "", *(f"- **{r['variant']} at N={r['workers']} diverged**: {r['diverged_why']}"
                                       for r in diverged), ""]
    lines += ["Plots: " + ", ".join(f"plots/{m}.png" for m in _plotted(rows)) + ".", ""]
    (out / "report.md").write_text("\n".join(lines))
    _plots(out / "plots", header, rows, variants)
    (out / "spec.json").write_text(json.dumps(header, indent=1))


def _goodput_metrics(rows: list[dict]) -> tuple[tuple[str, str], ...]:
    """Goodput's two figures, where some variant simulated its clean twin (`simulate.goodput`)."""
    return tuple(m for m in GOODPUT if any(r.get(m[0]) is not None for r in rows))


def _plotted(rows: list[dict]) -> tuple[str, ...]:
    """The metrics each spec's plots show (and its report names)."""
    return ("samples_per_second", "wait_fraction", "mean_staleness", *(m for m, _ in _goodput_metrics(rows)))


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)


def _plots(where: Path, header: dict, rows: list[dict], variants: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    where.mkdir(parents=True, exist_ok=True)
    for metric in _plotted(rows):
        fig = figure(header, metric, rows, variants)
        fig.savefig(where / f"{metric}.png", dpi=100)
        plt.close(fig)


def figure(header: dict, metric: str, rows: list[dict], variants: list[str]):
    """`metric` of every variant against N, a line each; where the spec sweeps one N, a bar each instead (in the
    spec's order, its value written beside it): one point per variant at one N would stack them on one another."""
    import matplotlib.pyplot as plt
    ns = sorted({r["workers"] for r in rows})
    label = metric.replace("_", " ")
    if len(ns) == 1:
        values = {r["variant"]: r[metric] for r in rows}
        fig, ax = plt.subplots(figsize=(6.5, max(2.5, 0.3 * len(variants) + 1.2)))
        ys = list(range(len(variants)))
        widths = [values.get(v) or 0 for v in variants]  # a missing value: no bar, "n/a" beside it
        ax.barh(ys, widths, color="tab:blue")
        for y, width, v in zip(ys, widths, variants):
            ax.text(width, y, f" {_fmt(values.get(v))}", va="center", fontsize=7)
        ax.set_yticks(ys, variants, fontsize=7)
        ax.invert_yaxis()  # the spec's first variant on top
        ax.set_xlabel(label)
        ax.margins(x=0.15)
        ax.set_title(f"{header['name']}: {label} at N = {ns[0]} (simulated)", fontsize=9)
        fig.tight_layout()
        return fig
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, v in enumerate(variants):
        pts = sorted((r["workers"], r[metric]) for r in rows if r["variant"] == v and r[metric] is not None)
        if not pts:
            continue
        # each variant its own marker, line style and size, hollow markers over filled ones: two variants
        # with equal values (a quorum's timing is async's) both stay visible, not one under the other
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="osD^v"[i % 5], linestyle=("-", "--", ":", "-.")[i % 4],
                markersize=max(3.0, 9.0 - 1.5 * i), fillstyle="full" if i % 2 == 0 else "none", label=v)
    ax.set_xscale("log", base=2)
    if metric == "samples_per_second":
        ax.set_yscale("log")
    elif metric == "mean_staleness":
        ax.set_yscale("symlog")  # sync's 0 stays on the plot
    ax.set_xlabel("workers N")
    ax.set_ylabel(label)
    ax.set_title(f"{header['name']}: {label} (simulated)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
