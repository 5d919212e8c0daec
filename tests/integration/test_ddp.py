"""An all-reduce baseline's rank outside psrv run: FSDP's runs under torchrun, and DDP's update count is
counted (optimizer steps that ran). Its equivalence with sync PS and its records:
test_allreduce_equivalence.py."""
from __future__ import annotations

import json
import sys

import pytest
import torch

import psrv.workers.allreduce.ddp
from tests.helpers import in_spawned_process, run_in_session
from psrv.config import JobConfig, RunConfig
from psrv.workers.allreduce.loop import train_allreduce

pytestmark = pytest.mark.timeout(180)


def test_an_fsdp_rank_runs_under_torchrun(tmp_path):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "psrv.workers.allreduce", "--mode", "fsdp", "--job", "digits_mlp", "--steps", "5", "--momentum", "0",
            "--out", str(tmp_path / "x.json"), "--params-out", str(tmp_path / "params.pt")]
    proc = run_in_session(argv, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rank0 = json.loads((tmp_path / "x.json").read_text())
    rank1 = json.loads((tmp_path / "x-rank1.json").read_text())
    assert (rank0["rank"], rank0["world_size"], rank1["rank"], rank0["mode"]) == (0, 2, 1, "fsdp")
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
    """train_allreduce for 4 steps with an optimizer whose step runs only every other call (in a spawned child)."""
    real = psrv.workers.allreduce.ddp.torch_optimizer

    def every_other_step(cfg, params):
        optimizer = real(cfg, params)
        step, calls = optimizer.step, []
        optimizer.step = lambda *a, **k: calls.append(1) or (step(*a, **k) if len(calls) % 2 else None)
        return optimizer

    psrv.workers.allreduce.ddp.torch_optimizer = every_other_step
    return train_allreduce(RunConfig(mode="ddp", job=JobConfig(steps=4)))
