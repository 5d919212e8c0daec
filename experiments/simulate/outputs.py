"""What a simulated run writes: a real run's files (summary.json, config.json, steps.csv, evals.csv)
and plots, each marked simulated (summary.json's `simulated` true, "(simulated)" in every title)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from psrv.experiments.simulate.cluster import Recorded
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.launcher.summary import EVAL_COLUMNS, STEP_COLUMNS
from psrv.config import to_dict

LABEL = "(simulated)"


def write_outputs(out: Path, cfg: SimulationConfig, summary: dict, rec: Recorded, *, evals: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    with open(out / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, STEP_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in sorted(rec.rows, key=lambda r: r["wall_time"]):
            writer.writerow({**row, "wall_time": round(row["wall_time"], 6)})
    extra = sorted({k for e in evals for k in e} - set(EVAL_COLUMNS))
    with open(out / "evals.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, EVAL_COLUMNS + tuple(extra), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(evals)
    write_plots(out / "plots", summary, evals)


def _title(summary: dict, what: str) -> str:
    mode = summary["mode"] + (f"({summary['staleness']})" if summary["mode"] == "ssp" else "")
    return f"{what} {LABEL}: {mode}, N={summary['num_workers']}, S={summary['num_servers']}"


def write_plots(where: Path, summary: dict, evals: list[dict]) -> None:
    """DIR/plots/staleness.png, clock_gap.png and, at the learning level, the job's metric against
    simulated wall time (metric.png)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    where.mkdir(parents=True, exist_ok=True)
    for key, name, xlabel in (("staleness_histogram", "staleness", "staleness of a push (updates)"),
                              ("clock_gap_histogram", "clock_gap", "clock gap of an answered pull (clocks)")):
        hist = {int(k): v for k, v in summary[key].items()}
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(list(hist), list(hist.values()), width=0.9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("count")
        ax.set_title(_title(summary, name.replace("_", " ")), fontsize=9)
        fig.tight_layout()
        fig.savefig(where / f"{name}.png", dpi=100)
        plt.close(fig)
    metric = summary.get("metric")
    column = f"eval_{metric}" if metric else None
    if column and evals and column in evals[0]:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([e["wall_time"] for e in evals], [e[column] for e in evals], marker="o")
        ax.set_xlabel("simulated wall time (s)")
        ax.set_ylabel(column)
        ax.set_title(_title(summary, column), fontsize=9)
        fig.tight_layout()
        fig.savefig(where / "metric.png", dpi=100)
        plt.close(fig)
