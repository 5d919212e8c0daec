"""A general job (DataLoader + DistributedSampler, dict batches, loss(model, batch), evaluate -> named
metrics) trains under sync PS and under DDP through the same interface, to the same parameters; its
metrics reach summary.json, evals.csv, and a spec whose target is one of them.

The sync PS run goes in threads of the test process (tests/threaded_run.py: psrv run's parser and config,
the shipped loop, the same files): what is compared is what it computes. The DDP run keeps its ranks'
processes (their process group), and the spec runs through the real `psrv experiment`."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from tests.helpers import psrv_argv, psrv_run, run_in_session
from tests.threaded_run import threaded_run

pytestmark = pytest.mark.timeout(240)

JOB = str(Path(__file__).with_name("jobs") / "regression_loader.py") + ":make"
# 200 samples / 2 ranks / batch 20 = 5 batches an epoch: 12 steps cross two epochs (set_epoch reshuffles)
ARGS = ("--job", JOB, "--workers", "2", "--steps", "12", "--batch-size", "20", "--optimizer", "sgd",
        "--lr", "0.05", "--momentum", "0", "--eval-every", "6")


def test_a_general_job_trains_the_same_under_sync_ps_and_ddp(tmp_path):
    ps = threaded_run(tmp_path / "sync", "--mode", "sync", "--servers", "1", *ARGS, timeout=90)
    ddp = psrv_run(tmp_path / "ddp", "--mode", "ddp", *ARGS, timeout=90)
    a, b = torch.load(tmp_path / "sync" / "params.pt"), torch.load(tmp_path / "ddp" / "params.pt")
    assert torch.allclose(a, b, atol=1e-5, rtol=0), f"max difference {(a - b).abs().max():.3g}"
    for summary in (ps, ddp):
        assert summary["metric"] == "mse" and summary["lower_is_better"] is True
        assert set(summary["eval_metrics"]) == {"loss", "mse", "mae"}
        assert summary["eval_metrics"]["mse"] < summary["initial_loss"]  # it learned
        assert summary["eval_accuracy"] is None  # a regression reports no accuracy, not an accuracy of 0
        assert summary["pushes"] == 24
    with open(tmp_path / "sync" / "evals.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["0", "6", "12"] and all(r["eval_mae"] for r in rows)
    with open(tmp_path / "sync" / "steps.csv") as f:
        assert {r["batch_size"] for r in csv.DictReader(f)} == {"20"}  # counted from the batches


def test_a_spec_targets_the_jobs_own_metric(tmp_path):
    # one worker: what is tested is the spec's target on the job's metric, in the report and the
    # summary, not the cluster (the test above trains on two)
    spec = tmp_path / "reg.toml"
    spec.write_text(f'''name = "reg"
seeds = [0]
[cluster]
servers = 1
workers = 1
[job]
name = "{JOB}"
steps = 12
batch_size = 20
eval_every = 3
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.0
[target]
metric = "mse"
value = 1e9
[[variants]]
mode = "async"
''')
    proc = run_in_session(psrv_argv("experiment", str(spec), "--out", str(tmp_path / "out")), timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Target: mse <= 1e+09" in report and "| final loss | mse | time to target s |" in report
    assert (tmp_path / "out" / "plots" / "mse_curves.png").stat().st_size > 1000
    with open(tmp_path / "out" / "summary.csv") as f:
        row = next(csv.DictReader(f))
    assert row["target_reached"] == "1" and float(row["final_target_metric"]) > 0
