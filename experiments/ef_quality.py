"""Error feedback's quality grid (experiments/specs/ef_quality.toml): the held-out loss of top-k and sign
with error feedback against dense pushes and against the same codec without error feedback, cell by
cell, from each run's stored config.json and summary.json (never from the spec's text).

    python -m psrv.experiments.ef_quality runs/ef_quality-digits_mlp runs/ef_quality-mnist1d_mlp ...

A cell is one job, momentum, lr and seed. It holds where, for each codec, the error-feedback run's loss is
within RATIO (1.3) of the dense run's and no worse than the run without error feedback. The grid is split
by job before any of it ran: CHOSEN_ON are the jobs the defaults were chosen on, every other job is held
out; the claim in docs/compression.md is the held-out half's (experiments/quality_grid.py: the judging).
"""
from __future__ import annotations

import sys
from pathlib import Path

from psrv.config import RunConfig
from psrv.experiments import quality_grid
from psrv.experiments.quality_grid import Claim, Grid

RATIO = 1.3  # error feedback's loss within this factor of dense pushes'
CHOSEN_ON = ("digits_mlp", "mnist1d_mlp")  # the warm-up, masking and sign scale were chosen on these
CODECS = ("topk:0.005", "sign")


def push_form(cfg: RunConfig) -> str:
    """"dense", or "<codec> ef" / "<codec> no ef"."""
    codec = cfg.worker.compress
    return "dense" if not codec else f"{codec} {'ef' if cfg.worker.error_feedback else 'no ef'}"


GRID = Grid(name="ef_quality", form_of=push_form, baseline="dense", ratio=RATIO, chosen_on=CHOSEN_ON,
            claims=tuple(Claim(codec, f"{codec} ef", f"{codec} no ef") for codec in CODECS),
            columns=(("top-k EF x dense", "topk:0.005 ef"), ("top-k no EF", "topk:0.005 no ef"),
                     ("sign EF x dense", "sign ef"), ("sign no EF", "sign no ef")))


def read_runs(folder: Path) -> list[quality_grid.Run]:
    return quality_grid.read_runs(folder, GRID)


def cells(runs: list[quality_grid.Run]) -> list[quality_grid.Cell]:
    return quality_grid.cells(runs, GRID)


def report(all_cells: list[quality_grid.Cell]) -> str:
    return quality_grid.report(all_cells, GRID)


if __name__ == "__main__":
    sys.exit(quality_grid.main(GRID, __doc__))
