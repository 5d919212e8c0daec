"""1-bit Adam's quality grid (experiments/specs/onebit_quality.toml): the held-out loss of onebit_adam with a
warm-up of full-gradient Adam against Adam and against onebit_adam without a warm-up (freeze_step 1), cell
by cell, from each run's stored config.json and summary.json (never from the spec's text).

    python -m psrv.experiments.harness.onebit_quality runs/onebit_quality-digits_cnn runs/onebit_quality-digits_mlp ...

A cell is one job, lr and seed. Each warm-up's claim holds there where its run's loss is within RATIO (1.3)
of Adam's and no worse than the run frozen at step 1. The grid is split by job before any of it ran:
CHOSEN_ON are the jobs 1-bit Adam's first figures were measured on, every other job is held out; the claim
in docs/compression.md is the held-out half's (experiments/harness/quality_grid.py: the judging).
"""
from __future__ import annotations

import sys

from psrv.config import RunConfig
from psrv.experiments.harness import quality_grid
from psrv.experiments.harness.quality_grid import Claim, Grid

RATIO = 1.3  # 1-bit Adam's loss within this factor of Adam's
CHOSEN_ON = ("digits_cnn", "digits_mlp")  # docs/benchmarks.md's 1-bit Adam runs; the momentum mask's
WARMUPS = (30, 60)  # freeze steps: 20% and 40% of the spec's 150 steps
NO_WARMUP = 1  # the least freeze_step onebit_adam takes: v from one clock's gradient


def optimizer_form(cfg: RunConfig) -> str:
    """"adam", or "onebit K=<freeze_step>"."""
    opt = cfg.optimizer
    return f"onebit K={opt.freeze_step}" if opt.name == "onebit_adam" else opt.name


GRID = Grid(name="onebit_quality", form_of=optimizer_form, baseline="adam", ratio=RATIO, chosen_on=CHOSEN_ON,
            claims=tuple(Claim(f"K={k}", f"onebit K={k}", f"onebit K={NO_WARMUP}") for k in WARMUPS),
            columns=tuple((f"K={k} x adam", f"onebit K={k}") for k in (NO_WARMUP, *WARMUPS)))

if __name__ == "__main__":
    sys.exit(quality_grid.main(GRID, __doc__))
