"""The DDP baseline: sync PS and DDP reach the same parameters; the worker also runs under torchrun;
its update count is counted (optimizer steps that ran), and it records no staleness (it has none)."""
from __future__ import annotations

import csv
import json
import sys

import pytest
import torch

import workers.ddp
from tests.helpers import in_spawned_process, psrv_run, run_in_session
from psrv.config import JobConfig, RunConfig
from workers.ddp import train_ddp
from workers.jobs import load_job

pytestmark = pytest.mark.timeout(180)

SGD = ("--workers", "2", "--steps", "20", "--batch-size", "32", "--optimizer", "sgd", "--lr", "0.1",
       "--momentum", "0", "--eval-every", "10")


def test_sync_ps_and_ddp_reach_the_same_parameters(tmp_path):
    psrv_run(tmp_path / "sync", "--mode", "sync", "--servers", "1", *SGD, timeout=80)
    summary = psrv_run(tmp_path / "ddp", "--mode", "ddp", *SGD, timeout=80)
    ps, ddp = torch.load(tmp_path / "sync" / "params.pt"), torch.load(tmp_path / "ddp" / "params.pt")
    initial = torch.cat([p.detach().reshape(-1) for p in load_job("digits_mlp", seed=0).model.parameters()])
    assert (ddp - initial).abs().max() > 1e-2                  # training really moved the weights
    assert torch.allclose(ps, ddp, atol=1e-5, rtol=0), f"max difference {(ps - ddp).abs().max():.3g}"

    assert summary["mode"] == "ddp" and summary["num_servers"] == 0
    # Counted by each rank: all-reduces that completed (2 ranks x 20) and optimizer steps that ran.
    assert summary["pushes"] == 40 and summary["updates_applied"] == 20
    # No staleness or clock gap to measure under all-reduce: absent (null), not a 0.
    assert (summary["max_staleness"], summary["mean_staleness"], summary["max_clock_gap"]) == (None,) * 3
    assert summary["final_loss"] < summary["initial_loss"]
    for rank in (0, 1):
        record = json.loads((tmp_path / "ddp" / f"worker-{rank}.json").read_text())
        assert [r["step"] for r in record["step_log"]] == list(range(20))
        assert all(r["compute_seconds"] > 0 and r["communication_seconds"] >= 0 for r in record["step_log"])
        assert (record["pushes"], record["updates_applied"]) == (20, 20)
        assert "max_staleness" not in record and all("staleness" not in r for r in record["step_log"])
    with open(tmp_path / "ddp" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 40 and {r["staleness"] for r in rows} == {""}
    evals = (tmp_path / "ddp" / "evals.csv").read_text().splitlines()
    assert [line.split(",")[1] for line in evals[1:]] == ["0", "10", "20"]


def test_ddp_worker_runs_under_torchrun(tmp_path):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "workers.ddp", "--job", "digits_mlp", "--steps", "5", "--momentum", "0",
            "--out", str(tmp_path / "x.json"), "--params-out", str(tmp_path / "params.pt")]
    proc = run_in_session(argv, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rank0 = json.loads((tmp_path / "x.json").read_text())
    rank1 = json.loads((tmp_path / "x-rank1.json").read_text())
    assert (rank0["rank"], rank0["world_size"], rank1["rank"]) == (0, 2, 1)
    assert rank0["updates_applied"] == rank1["updates_applied"] == 5 and len(rank1["step_log"]) == 5
    assert rank0["pushes"] == rank1["pushes"] == 5
    assert rank0["final_loss"] < rank0["initial_loss"] and "final_loss" not in rank1
    assert torch.load(tmp_path / "params.pt").numel() == rank0["parameters"]


def test_ddp_counts_the_optimizer_steps_that_ran(monkeypatch):
    # An optimizer whose step() does nothing on every other call: the rank still runs 4 steps and
    # all-reduces 4 gradients, but only 2 updates happen, and the record says 2, not `steps`.
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    record = in_spawned_process(_train_skipping_every_other_step)  # gloo in a process of its own
    assert len(record["step_log"]) == 4 and record["pushes"] == 4
    assert record["updates_applied"] == 2


def _train_skipping_every_other_step() -> dict:
    """train_ddp for 4 steps with an optimizer whose step runs only every other call (in a spawned child)."""
    real = workers.ddp.make_optimizer

    def every_other_step(cfg, params):
        optimizer = real(cfg, params)
        step, calls = optimizer.step, []
        optimizer.step = lambda *a, **k: calls.append(1) or (step(*a, **k) if len(calls) % 2 else None)
        return optimizer

    workers.ddp.make_optimizer = every_other_step
    return train_ddp(RunConfig(mode="ddp", job=JobConfig(steps=4)))
