"""Error feedback's quality grid (experiments/specs/ef_quality.toml): the held-out loss of top-k and sign
with error feedback against dense pushes and against the same codec without error feedback, cell by
cell, from each run's stored config.json and summary.json (never from the spec's text).

    python -m psrv.experiments.harness.ef_quality runs/ef_quality-digits_mlp runs/ef_quality-mnist1d_mlp ...

A cell is one job, momentum, lr and seed. It holds where, for each codec, the error-feedback run's loss is
within RATIO (1.3) of the dense run's and no worse than the run without error feedback. The grid is split
by job before any of it ran: CHOSEN_ON are the jobs the defaults were chosen on, every other job is held
out; the claim in docs/compression.md is the held-out half's (experiments/harness/quality_grid.py: the judging).
"""
from __future__ import annotations

import sys
from pathlib import Path

from psrv.config import RunConfig
from psrv.experiments.harness import quality_grid
from psrv.experiments.harness.quality_grid import Claim, Grid

RATIO = 1.3  # error feedback's loss within this factor of dense pushes'
CHOSEN_ON = ("digits_mlp", "mnist1d_mlp")  # the warm-up, masking and sign scale were chosen on these
CODECS = ("topk:0.005", "sign")


def push_form(cfg: RunConfig) -> str:
    """"dense", or "<codec> ef" / "<codec> no ef"."""
    codec = cfg.worker.compress
    return "dense" if not codec else f"{codec} {'ef' if cfg.worker.error_feedback else 'no ef'}"


def grid(name: str, codecs: tuple[str, ...]) -> Grid:
    """Each codec with error feedback held to dense and to itself without: ef_quality's, and ef_ratios'
    (experiments/harness/ef_ratios.py) at other top-k ratios."""
    header = lambda codec: "sign" if codec == "sign" else f"top-k {float(codec.split(':')[1]):.1%}"  # noqa: E731
    return Grid(name=name, form_of=push_form, baseline="dense", ratio=RATIO, chosen_on=CHOSEN_ON,
                claims=tuple(Claim(codec, f"{codec} ef", f"{codec} no ef") for codec in codecs),
                columns=tuple(col for codec in codecs for col in ((f"{header(codec)} EF x dense", f"{codec} ef"),
                                                                   (f"{header(codec)} no EF", f"{codec} no ef"))))


GRID = grid("ef_quality", CODECS)


def read_runs(folder: Path) -> list[quality_grid.Run]:
    return quality_grid.read_runs(folder, GRID)


def cells(runs: list[quality_grid.Run]) -> list[quality_grid.Cell]:
    return quality_grid.cells(runs, GRID)


def report(all_cells: list[quality_grid.Cell]) -> str:
    return quality_grid.report(all_cells, GRID)


if __name__ == "__main__":
    sys.exit(quality_grid.main(GRID, __doc__))
