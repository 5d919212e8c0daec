"""What every plot of the report shares: an Agg figure, saving it, a variant's colour and line style,
and the merged CSVs read once per variant."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from psrv.experiments.harness.collect import number, read_csv
from psrv.experiments.harness.spec import ExperimentSpec
from psrv.config import MODES

log = logging.getLogger("psrv.experiments.harness.report")

Rows = list[dict[str, str]]


def figure(nrows: int = 1, ncols: int = 1, *, width: float = 7.5, height: float = 4.5) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # render with Agg whatever pyplot's backend is
    return fig, list(fig.subplots(nrows, ncols, squeeze=False).flat)


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=110)
    log.info("report: wrote %s", path)


def color(i: int):
    """Variant i's colour: matplotlib's ten (C0..C9), then tab20b's and tab20c's twenty each, so up to 50
    variants get colours of their own (they used to repeat from the eleventh)."""
    if i < 10:
        return f"C{i}"
    from matplotlib import colormaps
    return colormaps["tab20b" if (i - 10) % 40 < 20 else "tab20c"]((i - 10) % 20)


def legend(fig: Figure, ax: Axes, *, many: int = 6) -> None:
    """The variants' legend: on the panel while there are few, else outside the panels on the right, where
    it covers no curve (with 20 variants it covered the first panel)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if len(handles) <= many:
        ax.legend(fontsize="small")
    else:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small", ncol=1 + len(handles) // 30)


def style(i: int) -> str:
    return ("-", "--", "-.", ":")[i % 4]  # lines that coincide (sync and ddp) stay visible


def pushed(row: dict[str, str]) -> bool:
    """Whether a steps.csv row pushed: with local steps only every H-th step does (`pushed` False on the
    others); a row without the column (all-reduce, or a run from before it) is a step that pushed."""
    return row.get("pushed") != "False"


def has_staleness(v: "VariantData") -> bool:
    """async, ssp and sync's quorum merges measure a spread of staleness; sync's barrier's is always 0 and
    all-reduce has none."""
    return v.mode in MODES and (v.mode != "sync" or v.quorum > 0)


@dataclass(frozen=True)
class VariantData:
    """One variant's merged CSVs (every repeat, `repeat` column) and its runs' update counts."""

    name: str
    mode: str
    steps: Rows
    evals: Rows
    updates: dict[int, float]  # repeat -> updates applied in that run (summary.json, via runs.csv)
    quorum: int = 0  # sync's --quorum (its merges have stale pushes)

    def repeats(self) -> list[int]:
        return sorted({int(number(r.get("repeat")) or 0) for r in self.steps + self.evals})

    def steps_of(self, repeat: int) -> Rows:
        return sorted((r for r in self.steps if int(number(r.get("repeat")) or 0) == repeat),
                      key=lambda r: number(r.get("wall_time")) or 0.0)

    def evals_of(self, repeat: int) -> Rows:
        return [r for r in self.evals if int(number(r.get("repeat")) or 0) == repeat]


def load(out: Path, spec: ExperimentSpec) -> list[VariantData]:
    runs = read_csv(out / "runs.csv")
    data = []
    for v in spec.variants:
        updates = {int(number(r["repeat"]) or 0): number(r.get("updates_applied")) or 0.0
                   for r in runs if r.get("variant") == v.name}
        data.append(VariantData(name=v.name, mode=v.mode, steps=read_csv(out / v.name / "steps.csv"),
                                evals=read_csv(out / v.name / "evals.csv"), updates=updates,
                                quorum=v.config.quorum))
    return data
