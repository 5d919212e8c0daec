"""Error feedback's quality grid's table (experiments/harness/ef_quality.py): cells from each run's stored config,
the 1.3x and no-worse-than-no-EF criterion per codec, and the split into chosen-on and held-out jobs."""
import json
import tomllib
from pathlib import Path

import pytest

from psrv.config import RunConfig, to_dict
from psrv.config.base import from_dict
from psrv.experiments.harness import ef_quality, ef_ratios
from psrv.experiments.harness.spec import spec_from_dict

PUSHES = {"dense": {}, "topk-ef": {"compress": "topk:0.005"},
          "topk-noef": {"compress": "topk:0.005", "error_feedback": False},
          "sign-ef": {"compress": "sign"}, "sign-noef": {"compress": "sign", "error_feedback": False}}


def _run(root, job, seed, push, loss, momentum=0.9):
    run = root / f"{push}-m{momentum}" / f"rep-{seed}"
    run.mkdir(parents=True)
    cfg = from_dict(RunConfig, {"mode": "sync", "seed": seed, "job": {"name": job},
                                "optimizer": {"momentum": momentum}, "worker": PUSHES[push]})
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))
    (run / "summary.json").write_text(json.dumps({"final_loss": loss}))


def test_each_cell_is_judged_per_codec_and_the_halves_are_split_by_job(tmp_path):
    losses = {("digits_cnn", 0): dict(dense=1.0, topk_ef=1.29, topk_noef=1.5, sign_ef=1.0, sign_noef=1.1),
              ("digits_cnn", 1): dict(dense=1.0, topk_ef=1.31, topk_noef=1.5, sign_ef=1.2, sign_noef=1.1),
              ("digits_mlp", 0): dict(dense=1.0, topk_ef=1.0, topk_noef=1.0, sign_ef=1.0, sign_noef=1.0)}
    for (job, seed), by_push in losses.items():
        for push, loss in by_push.items():
            _run(tmp_path / job, job, seed, push.replace("_", "-"), loss)
    _run(tmp_path / "digits_mlp", "digits_mlp", 0, "dense", 2.0, momentum=0.0)  # a cell with only dense

    cells = ef_quality.cells([r for job in ("digits_cnn", "digits_mlp")
                              for r in ef_quality.read_runs(tmp_path / job)])
    by = {(c.job, c.momentum, c.seed): c for c in cells}
    assert by[("digits_cnn", 0.9, 0)].failures() == []
    assert by[("digits_cnn", 0.9, 1)].failures() == ["topk:0.005: 1.31x dense",
                                                      "sign: worse than sign no ef (1.2000 > 1.1000)"]
    assert by[("digits_mlp", 0.0, 0)].failures() == ["topk:0.005: a run is missing", "sign: a run is missing"]
    report = ef_quality.report(cells)
    assert "### Chosen-on half (digits_mlp): 1 of 2 cells hold" in report
    assert "### Held-out half (digits_cnn): 1 of 2 cells hold" in report
    assert "| digits_cnn | 0.9 | 0.05 | 1.0000, 1.0000 | 1.29, 1.31 | 1.50, 1.50 | 1.00, 1.20 | 1.10, 1.10 |" in report


def test_two_runs_of_one_cell_are_refused(tmp_path):
    _run(tmp_path / "a", "digits_cnn", 0, "dense", 1.0)
    _run(tmp_path / "b", "digits_cnn", 0, "dense", 1.0)
    runs = ef_quality.read_runs(tmp_path / "a") + ef_quality.read_runs(tmp_path / "b")
    with pytest.raises(ValueError, match="two runs of dense"):
        ef_quality.cells(runs)


@pytest.mark.parametrize("module", [ef_quality, ef_ratios])
def test_each_spec_runs_every_form_of_its_grid_at_each_momentum_and_lr(module):
    spec_file = Path(__file__).parents[2] / "experiments" / "specs" / f"{module.GRID.name}.toml"
    spec = spec_from_dict(tomllib.loads(spec_file.read_text()), "digits_mlp3")
    forms = {(v.config.optimizer.momentum, v.config.optimizer.lr, ef_quality.push_form(v.config)) for v in spec.variants}
    needed = {"dense", *(f for c in module.GRID.claims for f in (c.remedy, c.without))}
    assert forms == {(m, lr, f) for m in (0.0, 0.9) for lr in (0.05, 0.1) for f in needed}
    assert {(v.config.job.name, v.config.job.steps, v.config.cluster.workers) for v in spec.variants} == {
        ("digits_mlp3", 200, 4)}
    assert not set(module.GRID.chosen_on) & {"digits_cnn", "digits_mlp3"}  # the held-out jobs stay held out


def test_the_ratio_grids_columns_name_each_ratio():
    assert [h for h, _ in ef_ratios.GRID.columns] == ["top-k 0.1% EF x dense", "top-k 0.1% no EF",
                                                       "top-k 2.0% EF x dense", "top-k 2.0% no EF"]


@pytest.mark.parametrize("settings, says", [
    ({}, []),
    ({"worker": {"compress": "topk:0.01"}}, ["top-k at 2%"]),  # 1% takes 2%'s line: momentum 0.9, psrv's default
    ({"worker": {"compress": "topk:0.02"}, "optimizer": {"momentum": 0.0}}, []),  # 2% held without momentum
    ({"worker": {"compress": "topk:0.05"}}, []),  # above 2%: not measured
    ({"worker": {"compress": "topk:0.003"}}, ["top-k at 0.5%"]),
    ({"worker": {"compress": "topk:0.0005"}}, ["top-k at 0.1%"]),
    ({"worker": {"compress": "sign"}}, []),  # lr 0.05, momentum 0.9: held on every job
    ({"worker": {"compress": "topk:0.005"}}, ["digits_mlp3"]),
    ({"worker": {"compress": "topk:0.001"}}, ["digits_mlp3"]),
    ({"worker": {"compress": "sign"}, "optimizer": {"lr": 0.1}}, ["lr/(1-momentum) = 1"]),
    ({"worker": {"compress": "topk:0.005"}, "optimizer": {"lr": 0.1}}, ["digits_mlp3", "lr/(1-momentum) = 1"]),
    ({"worker": {"compress": "sign"}, "optimizer": {"lr": 0.2, "momentum": 0.8}}, ["lr/(1-momentum) = 1"]),
    ({"worker": {"compress": "sign"}, "optimizer": {"lr": 0.09}}, []),  # 0.9: below where it failed
    ({"worker": {"compress": "sign", "error_feedback": False}, "optimizer": {"lr": 0.1}}, []),  # not error feedback
    ({"worker": {"compress": "sign", "momentum_correction": False}, "optimizer": {"lr": 0.1}}, []),  # nor its correction
    ({"worker": {"compress": "bf16"}, "optimizer": {"lr": 0.1}}, []),  # a cast is not lossy here
])
def test_the_commands_warn_where_the_grid_measured_error_feedback_off_dense(settings, says):
    from psrv.config.caveats import quality_caveats
    lines = quality_caveats(from_dict(RunConfig, settings))
    assert len(lines) == len(says) and all(s in line for s, line in zip(says, lines)), lines


def test_psrv_run_prints_the_warning_and_goes_on(capsys):
    from psrv.cli.main import main
    code = main(["run", "--compress", "sign", "--lr", "0.1", "--scheduler", "kubernetes", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0 and "kind: Job" in out  # the run's manifests: nothing refused
    [warning] = err.strip().splitlines()
    assert warning.startswith("psrv run: warning: --lr 0.1 with --momentum 0.9") and "digits_cnn" in warning
