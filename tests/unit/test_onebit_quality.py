"""1-bit Adam's quality grid (experiments/harness/onebit_quality.py over experiments/harness/quality_grid.py): forms from each
run's stored config (optimizer and freeze step), each warm-up held to 1.3x of Adam and to the run frozen at
step 1, and the split into chosen-on and held-out jobs; the spec's variants are the grid's forms."""
import json
import tomllib
from pathlib import Path

import pytest

from psrv.config import RunConfig, to_dict
from psrv.config.base import from_dict
from psrv.experiments.harness import onebit_quality, quality_grid
from psrv.experiments.harness.spec import spec_from_dict

SPEC = Path(__file__).parents[2] / "experiments" / "specs" / "onebit_quality.toml"


def _run(root, job, seed, freeze, loss, lr=0.002):
    """A finished run: Adam where `freeze` is None, else onebit_adam frozen at that step."""
    opt = {"name": "adam", "lr": lr} if freeze is None else {"name": "onebit_adam", "lr": lr, "freeze_step": freeze}
    run = root / f"k{freeze}-lr{lr}" / f"rep-{seed}"
    run.mkdir(parents=True)
    cfg = from_dict(RunConfig, {"mode": "sync", "seed": seed, "job": {"name": job}, "optimizer": opt})
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))
    (run / "summary.json").write_text(json.dumps({"final_loss": loss}))


def test_each_warmup_is_held_to_adam_and_to_no_warmup(tmp_path):
    losses = {("mnist1d_mlp", 0): {None: 1.0, 1: 1.5, 30: 1.4, 60: 1.2},
              ("mnist1d_mlp", 1): {None: 1.0, 1: None, 30: 1.1, 60: None},  # freeze 1 and 60 diverged
              ("digits_mlp", 0): {None: 1.0, 1: 1.1, 30: 1.2, 60: 1.05}}
    for (job, seed), by_freeze in losses.items():
        for freeze, loss in by_freeze.items():
            _run(tmp_path / job, job, seed, freeze, loss)  # None: a run that diverged (summary.json's final_loss)
    runs = [r for job in ("mnist1d_mlp", "digits_mlp")
            for r in quality_grid.read_runs(tmp_path / job, onebit_quality.GRID)]
    assert {r.form for r in runs} == {"adam", "onebit K=1", "onebit K=30", "onebit K=60"}
    assert {r.momentum for r in runs} == {0.0}  # Adam takes no SGD momentum: one momentum per cell
    by = {(c.job, c.seed): c for c in quality_grid.cells(runs, onebit_quality.GRID)}
    assert by["mnist1d_mlp", 0].failures() == ["K=30: 1.40x adam"]
    assert by["mnist1d_mlp", 1].failures() == ["K=60: no final loss (diverged or failed)"]  # finite beats diverged
    assert by["digits_mlp", 0].failures() == ["K=30: worse than onebit K=1 (1.2000 > 1.1000)"]
    report = quality_grid.report(list(by.values()), onebit_quality.GRID)
    assert "### Chosen-on half (digits_mlp): 0 of 1 cells hold" in report
    assert "### Held-out half (mnist1d_mlp): 0 of 2 cells hold" in report
    assert "- K=30: 1 of 2 cells; within 1.3x of adam in 1, no worse than onebit K=1 in 2" in report
    assert "- K=60: 1 of 2 cells; within 1.3x of adam in 1, no worse than onebit K=1 in 1" in report
    assert "| mnist1d_mlp | 0 | 0.002 | 1.0000, 1.0000 | 1.50, nan | 1.40, 1.10 | 1.20, nan |" in report


def test_the_spec_runs_every_form_of_the_grid_at_each_lr():
    spec = spec_from_dict(tomllib.loads(SPEC.read_text()), "mnist1d_mlp")
    forms = {(v.config.optimizer.lr, onebit_quality.optimizer_form(v.config)) for v in spec.variants}
    needed = {onebit_quality.GRID.baseline, *(f for c in onebit_quality.GRID.claims for f in (c.remedy, c.without))}
    assert forms == {(lr, f) for lr in (0.002, 0.004) for f in needed}
    assert {v.config.job.name for v in spec.variants} == {"mnist1d_mlp"}
    assert {v.config.job.steps for v in spec.variants} == {150}  # the warm-ups are 20% and 40% of it
    assert not set(onebit_quality.CHOSEN_ON) & {"mnist1d_mlp", "digits_mlp3"}  # the held-out jobs stay held out


@pytest.mark.parametrize("optimizer, warns", [
    ({"name": "onebit_adam", "freeze_step": 30, "lr": 0.002}, True),
    ({"name": "onebit_adam", "freeze_step": 1000, "lr": 0.0005}, True),  # no setting of it held on the held-out jobs
    ({"name": "adam", "lr": 0.002}, False),
])
def test_the_commands_warn_for_every_onebit_adam_run(optimizer, warns):
    from psrv.config.caveats import quality_caveats
    lines = quality_caveats(from_dict(RunConfig, {"mode": "sync", "optimizer": optimizer}))
    assert (len(lines) == 1 and "diverged" in lines[0] and "mnist1d_mlp" in lines[0]) if warns else lines == [], lines
