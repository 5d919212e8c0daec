"""Sync mode with SGD is single-process SGD on the global batch: same samples, same parameters."""
from pathlib import Path

import pytest
import torch

from psrv.cli import build_parser
from psrv.config import RunConfig
from psrv.config.cli_args import config_from_args
from psrv.workers.data import batch_indices
from psrv.workers.jobs import load_job
from tests.threaded_run import run_in_threads

WORKERS, BATCH, STEPS, LR, MOMENTUM = 3, 16, 20, 0.1, 0.9
def run_config(*args: str) -> RunConfig:
    """The run `psrv run ARGS` would make."""
    return config_from_args(RunConfig, build_parser().parse_args(["run", *args]))


WIDE = str(Path(__file__).parent / "jobs" / "wide_digits.py") + ":make"  # big enough for a payload plane


def big_batch_sgd(*, workers: int = WORKERS, clip: float = 0.0, norms: list[float] | None = None,
                  job_name: str = "digits_mlp") -> torch.Tensor:
    """Single-process SGD on the global batch of `workers` workers; with `clip`, each step's gradient
    is clipped by torch's clip_grad_norm_ first (its norms before clipping appended to `norms`)."""
    job = load_job(job_name, seed=0)
    model = job.model
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = job.train
    streams = [batch_indices(len(x), rank=r, world_size=workers, batch_size=BATCH, seed=0) for r in range(workers)]
    for _ in range(STEPS):
        idx = torch.cat([next(s) for s in streams])          # the global batch N*b of this step
        opt.zero_grad()
        job.loss_fn(model(x[idx]), y[idx]).backward()
        if clip:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if norms is not None:
                norms.append(float(norm))
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.timeout(180)
def test_sync_equals_single_process_big_batch_sgd():
    """The design's equivalence for the run `psrv run` makes of these options, 3 workers on the default
    job: the shipped worker loop and servers, in threads here (test_clip.py's sync run goes through
    `psrv run` and its processes, to the same reference). (Over 3 shards, torch RPC and each payload
    plane, bit for bit the plain path's: tests/conformance/test_matrix.py.)"""
    records, _ = run_in_threads(run_config("--mode", "sync", "--servers", "1", "--workers", str(WORKERS),
                                           "--steps", str(STEPS), "--batch-size", str(BATCH), "--optimizer", "sgd",
                                           "--lr", str(LR), "--momentum", str(MOMENTUM)))
    got = records[0]["final_params"]  # rank 0's weights after every worker's last push (psrv run's params.pt)
    want = big_batch_sgd()
    initial = torch.cat([p.detach().reshape(-1) for p in load_job("digits_mlp", seed=0).model.parameters()])
    assert (want - initial).abs().max() > 1e-2               # the reference really moved
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.timeout(240)
def test_bfloat16_gradients_on_the_wire_learn_as_well_as_float32():
    # Runs in threads (not about processes); rank 0's record holds what summary.json takes from it.
    runs = {dtype: run_in_threads(run_config("--mode", "sync", "--wire-dtype", dtype, "--steps", "200"))[0][0]
            for dtype in ("float32", "bfloat16")}
    assert runs["bfloat16"]["wire_dtype"] == "bfloat16"
    assert runs["float32"]["eval_accuracy"] >= 0.85, runs["float32"]
    assert abs(runs["bfloat16"]["eval_accuracy"] - runs["float32"]["eval_accuracy"]) <= 0.02, runs
