"""The async update rules' quality grid (experiments/specs/async_quality.toml): the held-out loss of async
SGD with staleness-lr, dc-asgd and dc-asgd-a against sync and against plain async, cell by cell, from each
run's stored config.json and summary.json (never from the spec's text).

    python -m psrv.experiments.harness.async_quality runs/async_quality-digits_mlp runs/async_quality-mnist1d_mlp ...

A cell is one job, momentum, lr and seed. Each rule's claim holds there where its run's loss is within
RATIO (1.3) of the sync run's and no worse than plain async's. The grid is split by job before any of it
ran: CHOSEN_ON are the jobs the rules' first figures were measured on, every other job is held out; the
claim in docs/algorithms.md is the held-out half's (experiments/harness/quality_grid.py: the judging).
"""
from __future__ import annotations

import sys

from psrv.config import RunConfig
from psrv.experiments.harness import quality_grid
from psrv.experiments.harness.quality_grid import Claim, Grid

RATIO = 1.3  # a rule's loss within this factor of sync's
CHOSEN_ON = ("digits_mlp", "mnist1d_mlp")  # docs/algorithms.md's first figures: digits_mlp, 8 workers
RULES = ("staleness-lr", "dc-asgd", "dc-asgd-a")


def rule_form(cfg: RunConfig) -> str:
    """"sync", or "async <rule>" ("async plain" without one)."""
    return cfg.mode if cfg.mode != "async" else f"async {cfg.optimizer.update_rule}"


GRID = Grid(name="async_quality", form_of=rule_form, baseline="sync", ratio=RATIO, chosen_on=CHOSEN_ON,
            claims=tuple(Claim(rule, f"async {rule}", "async plain") for rule in RULES),
            columns=(("async plain x sync", "async plain"),
                     *((f"{rule} x sync", f"async {rule}") for rule in RULES)))

if __name__ == "__main__":
    sys.exit(quality_grid.main(GRID, __doc__))
