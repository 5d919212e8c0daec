"""BatchNorm under sync PS and under DDP: each worker normalises by its own batch's statistics, the
gradients are averaged, and rank 0's buffers are the model's (DDP broadcasts rank 0's at each
forward), so both end with the same parameters and the same running statistics (rank 0's model.pt)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers import psrv_run
from tests.threaded_run import threaded_run

JOB = '''"""A small BatchNorm classifier on seeded data."""
import torch

from psrv.workers.jobs import Job


def make(seed):
    gen = torch.Generator().manual_seed(3)
    teacher = torch.randn(8, 3, generator=gen)
    x, xt = torch.randn(512, 8, generator=gen) * 2 + 1, torch.randn(128, 8, generator=gen) * 2 + 1
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    return Job("bn_mlp", model, (x, (x @ teacher).argmax(1)), (xt, (xt @ teacher).argmax(1)))
'''
STEPS = 20


@pytest.mark.timeout(240)
def test_sync_ps_and_ddp_end_with_the_same_parameters_and_buffers(tmp_path):
    (tmp_path / "bn_job.py").write_text(JOB)
    common = ("--workers", "2", "--job", f"{tmp_path / 'bn_job.py'}:make", "--steps", str(STEPS),
              "--batch-size", "16", "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9", "--seed", "0")
    # DDP's ranks are a process group, so `psrv run` and its processes; sync PS, what DDP is held
    # against, is the run `psrv run` makes of the same options in threads of this process.
    threaded_run(tmp_path / "sync", "--mode", "sync", "--servers", "1", *common, timeout=100)
    psrv_run(tmp_path / "ddp", "--mode", "ddp", *common, timeout=100)
    ps, ddp = (torch.load(tmp_path / run / "model.pt") for run in ("sync", "ddp"))
    assert list(ps) == list(ddp) and "1.running_mean" in ps and "1.num_batches_tracked" in ps
    for name in ps:
        torch.testing.assert_close(ps[name], ddp[name], rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}")
    # the running statistics really moved from their init (mean 0, var 1), one update per step
    assert ps["1.running_mean"].abs().max() > 0.1 and (ps["1.running_var"] - 1).abs().max() > 0.1
    assert int(ps["1.num_batches_tracked"]) == STEPS
    # and the parameters in model.pt are the ones params.pt holds
    flat = torch.cat([ps[k].reshape(-1) for k in ps if "running" not in k and "num_batches" not in k])
    assert torch.equal(flat, torch.load(tmp_path / "sync" / "params.pt"))
