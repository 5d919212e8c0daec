"""Where a quality grid measured a remedy failing its claim on jobs nobody tuned it on: one line per such
setting a run has, for `psrv run` and `psrv experiment` to print as a warning (the run goes ahead; these are
measurements, not refusals). The grids: error feedback's (docs/compression.md, psrv/config/codec_knobs.py
`codec_caveats`), the async update rules' (docs/algorithms.md, "Remedies on cases nobody tuned them on";
experiments/specs/async_quality.toml) and 1-bit Adam's warm-up (docs/compression.md, "1-bit Adam's quality
grid"; experiments/specs/onebit_quality.toml)."""
from __future__ import annotations

from psrv.config.codec_knobs import codec_caveats

REMEDY_RULES = ("staleness-lr", "dc-asgd", "dc-asgd-a")
GRID = "docs/algorithms.md, Remedies on cases nobody tuned them on"


def rule_caveats(run) -> list[str]:
    """The async rules' grid (8 async workers, 200 steps each, SGD at lr 0.05 and 0.1): at momentum 0.9 no
    rule came within 1.3x of sync's held-out loss on digits_cnn or digits_mlp3 in most cells; at momentum 0
    dc-asgd and dc-asgd-a did not at lr 0.1 on digits_cnn. Momenta between were not measured."""
    o = run.optimizer
    if run.mode != "async" or o.update_rule not in REMEDY_RULES:
        return []
    if o.momentum >= 0.9 - 1e-9:
        return [f"--update-rule {o.update_rule} with --momentum {o.momentum:g}: at momentum 0.9, 8 async workers, "
                f"{o.update_rule} ended {_MOMENTUM_09[o.update_rule]} sync's held-out loss on digits_cnn and "
                f"digits_mlp3, jobs it was not measured on first ({GRID})"]
    if o.update_rule != "staleness-lr" and o.momentum == 0 and o.lr >= 0.1 - 1e-9:
        return [f"--update-rule {o.update_rule} with --lr {o.lr:g}: at lr 0.1 without momentum, 8 async workers, "
                f"{o.update_rule} ended {_LR_01[o.update_rule]} sync's held-out loss on digits_cnn ({GRID})"]
    return []


# the held-out half's measurements (experiments/specs/async_quality.toml, 3 seeds a cell)
_MOMENTUM_09 = {"staleness-lr": "1.0-74x", "dc-asgd": "13-74x (or diverged)", "dc-asgd-a": "13-15x (or diverged)"}
_LR_01 = {"dc-asgd": "1.4-48x", "dc-asgd-a": "1.4-1.7x"}


def onebit_caveats(run) -> list[str]:
    """1-bit Adam's grid (sync, 4 workers, 150 steps, lr 0.002 and 0.004, frozen at 20% and 40%): every run on
    the two 3-hidden-layer MLPs diverged within 7 steps of the freeze, whatever the warm-up; it held on
    digits_cnn and digits_mlp, where it was first measured. Nothing of the job tells them apart before the
    run, so the line is for every onebit_adam run."""
    if run.optimizer.name != "onebit_adam":
        return []
    return ["--optimizer onebit_adam: frozen at 20% or 40% of 150 steps (lr 0.002 and 0.004, sync, 4 workers), every "
            "run on mnist1d_mlp and digits_mlp3 (3 hidden layers) diverged within 7 steps of the freeze; within "
            "1.3x of Adam's held-out loss in 8 of 12 cells on digits_cnn and digits_mlp (docs/compression.md, "
            "1-bit Adam's quality grid)"]


def quality_caveats(run) -> list[str]:
    """Every caveat of the quality grids this run's settings meet (see the module's docstring)."""
    return codec_caveats(run) + rule_caveats(run) + onebit_caveats(run)
