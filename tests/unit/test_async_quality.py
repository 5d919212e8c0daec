"""The async rules' quality grid (experiments/harness/async_quality.py over experiments/harness/quality_grid.py): forms from
each run's stored config (mode and update rule), each rule held to 1.3x of sync and to plain async, and the
split into chosen-on and held-out jobs; the spec's variants are the grid's forms."""
import json
import tomllib
from pathlib import Path

import pytest

from psrv.config import RunConfig, to_dict
from psrv.config.base import from_dict
from psrv.experiments.harness import async_quality, quality_grid
from psrv.experiments.harness.spec import spec_from_dict

FORMS = {"sync": ("sync", "plain"), "plain": ("async", "plain"), "slr": ("async", "staleness-lr"),
         "dc": ("async", "dc-asgd"), "dca": ("async", "dc-asgd-a")}
SPEC = Path(__file__).parents[2] / "experiments" / "specs" / "async_quality.toml"


def _run(root, job, seed, form, loss, momentum=0.9):
    mode, rule = FORMS[form]
    run = root / f"{form}-m{momentum}" / f"rep-{seed}"
    run.mkdir(parents=True)
    cfg = from_dict(RunConfig, {"mode": mode, "seed": seed, "job": {"name": job},
                                "optimizer": {"momentum": momentum, "update_rule": rule}})
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))
    (run / "summary.json").write_text(json.dumps({"final_loss": loss}))


def test_each_rule_is_held_to_sync_and_to_plain_async(tmp_path):
    losses = {("digits_cnn", 0): dict(sync=1.0, plain=2.3, slr=1.29, dc=2.4, dca=1.5),
              ("digits_cnn", 1): dict(sync=1.0, plain=None, slr=1.2, dc=1.3, dca=None),  # plain diverged
              ("digits_mlp", 0): dict(sync=1.0, plain=1.1, slr=1.2, dc=None, dca=1.0)}
    for (job, seed), by_form in losses.items():
        for form, loss in by_form.items():
            _run(tmp_path / job, job, seed, form, loss)  # None: a run that diverged (summary.json's final_loss)
    runs = [r for job in ("digits_cnn", "digits_mlp") for r in quality_grid.read_runs(tmp_path / job, async_quality.GRID)]
    cells = quality_grid.cells(runs, async_quality.GRID)
    assert cells[1].failures() == ["dc-asgd-a: no final loss (diverged or failed)"]  # finite beats diverged
    by = {c.job: c for c in cells if c.seed == 0}
    assert by["digits_cnn"].failures() == ["dc-asgd: 2.40x sync", "dc-asgd: worse than async plain (2.4000 > 2.3000)",
                                           "dc-asgd-a: 1.50x sync"]
    assert by["digits_mlp"].failures() == ["staleness-lr: worse than async plain (1.2000 > 1.1000)",
                                           "dc-asgd: no final loss (diverged or failed)"]
    (tmp_path / "digits_mlp" / "dca-m0.9" / "rep-0" / "summary.json").unlink()
    runs = [r for job in ("digits_cnn", "digits_mlp") for r in quality_grid.read_runs(tmp_path / job, async_quality.GRID)]
    cells = quality_grid.cells(runs, async_quality.GRID)
    assert cells[-1].job == "digits_mlp" and cells[-1].failures()[-1] == "dc-asgd-a: a run is missing"
    report = quality_grid.report(cells, async_quality.GRID)
    assert "### Held-out half (digits_cnn): 0 of 2 cells hold" in report
    assert "- staleness-lr: 2 of 2 cells; within 1.3x of sync in 2, no worse than async plain in 2" in report
    assert "- dc-asgd: 1 of 2 cells; within 1.3x of sync in 1, no worse than async plain in 1" in report
    assert "- dc-asgd-a: 0 of 2 cells; within 1.3x of sync in 0, no worse than async plain in 1" in report
    assert "| digits_cnn | 0.9 | 0.05 | 1.0000, 1.0000 | 2.30, nan | 1.29, 1.20 | 2.40, 1.30 | 1.50, nan |" in report


def test_the_spec_runs_every_form_of_the_grid_at_each_momentum_and_lr():
    raw = tomllib.loads(SPEC.read_text())
    spec = spec_from_dict(raw, "digits_cnn")
    forms = {(v.config.optimizer.momentum, v.config.optimizer.lr, async_quality.rule_form(v.config))
             for v in spec.variants}
    needed = {async_quality.GRID.baseline, *(f for c in async_quality.GRID.claims for f in (c.remedy, c.without))}
    assert forms == {(m, lr, f) for m in (0.0, 0.9) for lr in (0.05, 0.1) for f in needed}
    assert {v.config.job.name for v in spec.variants} == {"digits_cnn"}
    assert not set(async_quality.CHOSEN_ON) & {"digits_cnn", "digits_mlp3"}  # the held-out jobs stay held out


@pytest.mark.parametrize("settings, says", [
    ({"mode": "async"}, ""),  # no rule: nothing claimed
    ({"mode": "async", "optimizer": {"update_rule": "staleness-lr"}}, "1.0-74x"),  # momentum 0.9, psrv's default
    ({"mode": "async", "optimizer": {"update_rule": "dc-asgd-a", "momentum": 0.95}}, "13-15x"),
    ({"mode": "async", "optimizer": {"update_rule": "dc-asgd", "momentum": 0.0, "lr": 0.1}}, "1.4-48x"),
    ({"mode": "async", "optimizer": {"update_rule": "dc-asgd", "momentum": 0.0, "lr": 0.05}}, ""),  # held there
    ({"mode": "async", "optimizer": {"update_rule": "staleness-lr", "momentum": 0.0, "lr": 0.1}}, ""),
    ({"mode": "async", "optimizer": {"update_rule": "staleness-lr", "momentum": 0.5}}, ""),  # not measured
    ({"mode": "ssp", "staleness": 2, "optimizer": {"update_rule": "staleness-lr"}}, ""),  # the grid ran async
])
def test_the_commands_warn_where_the_grid_measured_a_rule_off_sync(settings, says):
    from psrv.config.caveats import quality_caveats
    lines = quality_caveats(from_dict(RunConfig, settings))
    assert (lines == []) if not says else (len(lines) == 1 and says in lines[0] and "digits_cnn" in lines[0]), lines
