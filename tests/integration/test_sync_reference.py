"""Sync mode with SGD is single-process SGD on the global batch: same samples, same parameters."""
from pathlib import Path

import pytest
import torch

from tests.helpers import psrv_run
from workers.data import batch_indices
from workers.jobs import load_job

WORKERS, BATCH, STEPS, LR, MOMENTUM = 3, 16, 20, 0.1, 0.9
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
@pytest.mark.parametrize("transport, shards", [("zmq", 1), ("zmq", 3), ("rpc", 3)])
def test_sync_equals_single_process_big_batch_sgd(transport, shards, tmp_path):
    summary = psrv_run(tmp_path, "--mode", "sync", "--transport", transport, "--servers", str(shards), "--workers", str(WORKERS),
             "--steps", str(STEPS), "--batch-size", str(BATCH), "--optimizer", "sgd", "--lr", str(LR),
             "--momentum", str(MOMENTUM))
    got = torch.load(tmp_path / "params.pt")
    want = big_batch_sgd()
    initial = torch.cat([p.detach().reshape(-1) for p in load_job("digits_mlp", seed=0).model.parameters()])
    assert (want - initial).abs().max() > 1e-2               # the reference really moved
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    if shards > 1:  # shards pushed while backward still ran (the default overlap), and still exact
        assert summary["early_sends"] > 0, summary


@pytest.mark.timeout(180)
def test_sync_over_the_bulk_plane_equals_single_process_big_batch_sgd(tmp_path):
    """Tensors on the bulk plane's TCP connections (psrv/transport/bulk.py), shared memory off."""
    summary = psrv_run(tmp_path, "--mode", "sync", "--job", WIDE, "--bulk", "auto", "--shared-memory", "off",
                       "--servers", "1", "--workers", "2", "--steps", str(STEPS), "--batch-size", str(BATCH),
                       "--optimizer", "sgd", "--lr", str(LR), "--momentum", str(MOMENTUM))
    got, want = torch.load(tmp_path / "params.pt"), big_batch_sgd(workers=2, job_name=WIDE)
    initial = torch.cat([p.detach().reshape(-1) for p in load_job(WIDE, seed=0).model.parameters()])
    paths = summary["payload_bytes"]  # every push and pull went over the bulk plane's connections
    assert paths["bulk"] >= 2 * 2 * STEPS * 4 * initial.numel() and paths["inline"] <= paths["bulk"] / 20, paths
    assert (want - initial).abs().max() > 1e-2
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.timeout(240)
def test_bfloat16_gradients_on_the_wire_learn_as_well_as_float32(tmp_path):
    runs = {dtype: psrv_run(tmp_path / dtype, "--mode", "sync", "--wire-dtype", dtype, "--steps", "200")
            for dtype in ("float32", "bfloat16")}
    assert runs["bfloat16"]["wire_dtype"] == "bfloat16"
    assert runs["float32"]["eval_accuracy"] >= 0.85, runs["float32"]
    assert abs(runs["bfloat16"]["eval_accuracy"] - runs["float32"]["eval_accuracy"]) <= 0.02, runs
