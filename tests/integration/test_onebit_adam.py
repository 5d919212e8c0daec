"""1-bit Adam (--optimizer onebit_adam --freeze-step K) on real shards (zmq, 2 shards served from threads,
2 workers in threads), against single-process references of the same math: N workers' gradients,
their local momenta, scaled sign per chunk of 1024 with error feedback, the mean, the frozen variance.
Three inputs are always zero (as digits' blank pixels), so their weights' v is 0 at the freeze.
Degenerate cases: K past the last step is torch.optim.Adam on the mean gradient; an identity codec
(topk:1.0) after the freeze is Adam with its variance frozen."""
from __future__ import annotations

import math

import pytest
import torch

import psrv
from psrv.config import OptimConfig, ServerConfig
from psrv.partition import PartitionPlan
from psrv.server.run import Server
from tests.helpers import each_rank_in_threads

pytestmark = pytest.mark.timeout(120)
WORKERS, SHARDS, STEPS, LR, BETAS, EPS, CHUNK, MIN_NUMEL = 2, 2, 8, 0.01, (0.9, 0.999), 1e-8, 1024, 1024


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # 2,560 + 40 + 40 + 1 parameters: two sign chunks and more, biases dense
    return torch.nn.Sequential(torch.nn.Linear(64, 40), torch.nn.Tanh(), torch.nn.Linear(40, 1))


ZERO_INPUTS = 3  # inputs 0..2 are always 0: the first layer's weights from them never get a gradient


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(32, 64, generator=g)
    x[:, :ZERO_INPUTS] = 0
    return x, torch.randn(32, 1, generator=g)


def _never_moved() -> torch.Tensor:
    """The flat positions of the weights from the always-zero inputs (40 rows of the first layer)."""
    return torch.arange(40 * 64).view(40, 64)[:, :ZERO_INPUTS].reshape(-1)


def _flat_grad(model: torch.nn.Module, rank: int) -> torch.Tensor:
    model.zero_grad()
    x, y = _data(rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _set(model: torch.nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat, list(model.parameters()))


def _sign(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """Scaled sign (||x||_1 / d) sign(x) of EF-SignSGD (--sign-scale auto's under onebit_adam) over each
    shard range's chunks of 1024 (+1 for x >= 0), ||x||_1 and d over the chunk's compressed elements only;
    the elements of small tensors (`dense`) sent exactly."""
    out = x.clone()
    for lo, hi in PartitionPlan.from_module(_model(), SHARDS).ranges:
        for a in range(lo, hi, CHUNK):
            own = torch.arange(a, min(a + CHUNK, hi))[~dense[a:min(a + CHUNK, hi)]]
            out[own] = x[own].abs().mean() * torch.where(x[own] >= 0, 1.0, -1.0)
    return out


def _identity(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    return x.clone()


def reference(freeze_step: int, codec) -> torch.Tensor:
    """The weights after STEPS steps of 1-bit Adam as psrv/client/onebit.py and psrv/server/onebit_adam.py
    describe it, in one process: torch.optim.Adam on the mean gradient up to the freeze, each worker's
    own momentum throughout, then the mean of codec(m_i + e_i) as the momentum over the frozen variance,
    masked to 0 where v is 0 (DeepSpeed's exp_avg_mask for gradients that are always exactly 0)."""
    model = _model()
    dense = torch.cat([torch.full((p.numel(),), p.numel() < MIN_NUMEL) for p in model.parameters()])
    adam = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS)
    local = [torch.zeros_like(dense, dtype=torch.float32) for _ in range(WORKERS)]
    error = [torch.zeros_like(m) for m in local]
    for t in range(1, STEPS + 1):
        grads = [_flat_grad(model, r) for r in range(WORKERS)]
        for m, g in zip(local, grads):
            m.lerp_(g, 1 - BETAS[0])
        if t <= freeze_step:
            torch.nn.utils.vector_to_parameters(sum(grads) / WORKERS, [p.grad for p in model.parameters()])
            adam.step()
            continue
        sent = []
        for m, e in zip(local, error):
            x = m + e
            sent.append(codec(x, dense))
            e.copy_(x - sent[-1])
        v = torch.cat([adam.state[p]["exp_avg_sq"].reshape(-1) for p in model.parameters()])
        momentum = torch.where(v > 0, sum(sent) / WORKERS, 0.0)
        denom = v.sqrt() / math.sqrt(1 - BETAS[1] ** freeze_step) + EPS
        _set(model, _flat(model) - LR / (1 - BETAS[0] ** t) * momentum / denom)
    return _flat(model)


def frozen_adam(freeze_step: int) -> torch.Tensor:
    """Adam on the mean gradient, its variance (and v's bias correction) frozen after `freeze_step`."""
    model = _model()
    n = _flat(model).numel()
    m, v = torch.zeros(n), torch.zeros(n)
    for t in range(1, STEPS + 1):
        g = sum(_flat_grad(model, r) for r in range(WORKERS)) / WORKERS
        m = BETAS[0] * m + (1 - BETAS[0]) * g
        if t <= freeze_step:
            v = BETAS[1] * v + (1 - BETAS[1]) * g * g
        vhat = v / (1 - BETAS[1] ** min(t, freeze_step))
        _set(model, _flat(model) - LR * (m / (1 - BETAS[0] ** t)) / (vhat.sqrt() + EPS))
    return _flat(model)


def run_psrv(freeze_step: int, compress: str) -> tuple[torch.Tensor, list[tuple[dict, dict]]]:
    """STEPS sync steps of 2 workers (threads) on 2 onebit_adam shards (threads, zmq); rank 0's final
    weights and each worker's (state_dict(), compression())."""
    optim = OptimConfig(name="onebit_adam", lr=LR, betas=BETAS, eps=EPS, freeze_step=freeze_step)
    servers = [Server(ServerConfig(shard=s, num_shards=SHARDS, workers=WORKERS, mode="sync", optimizer=optim,
                                   bind="tcp://127.0.0.1:0", worker_timeout=30.0)) for s in range(SHARDS)]
    for s in servers:
        s.start()
    models = [_model() for _ in range(WORKERS)]
    states = [None] * WORKERS

    def work(rank: int) -> None:
        ps = psrv.Worker(models[rank], [s.address for s in servers], rank=rank, world_size=WORKERS,
                         timeout=30, compress=compress, compress_min_numel=MIN_NUMEL)
        x, y = _data(rank)
        for _ in range(STEPS):
            torch.nn.functional.mse_loss(models[rank](x), y).backward()
            ps.step()
        states[rank] = (ps.state_dict(), ps.compression())
        ps.close()

    try:
        each_rank_in_threads(work, WORKERS)
    finally:
        for s in servers:
            s.stop()
            s.join(10)
    return _flat(models[0]), states


@pytest.mark.parametrize("compress", ["", "topk:1.0"], ids=["sign", "identity"])
def test_onebit_adam_on_real_shards_equals_the_single_process_reference(compress):
    freeze = 3
    got, states = run_psrv(freeze, compress)
    start = _flat(_model())
    if compress:  # the identity codec: Adam with its variance frozen, and the reference agrees
        want = frozen_adam(freeze)
        torch.testing.assert_close(reference(freeze, _identity), want, rtol=0, atol=1e-6)
    else:
        want = reference(freeze, _sign)
        assert (want - frozen_adam(freeze)).abs().max() > 1e-4  # sign's error shows: the test can tell
    assert (want - start).abs().max() > 1e-2  # the reference moved
    never = _never_moved()
    torch.testing.assert_close(got[never], start[never], rtol=0, atol=0)  # v is 0 there: the mask held them
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert [said["compress"] for _, said in states] == [compress or "sign"] * WORKERS  # what ran is what it says
    assert all(state["onebit"]["momentum"].abs().sum() > 0 for state, _ in states)
    assert all(state["compress"]["error"].abs().sum() > 0 for state, _ in states) == (not compress)


def test_freeze_step_past_the_last_step_is_adam_on_the_mean_gradient():
    got, _ = run_psrv(STEPS, "")
    model = _model()
    adam = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS)
    for _ in range(STEPS):
        grads = [_flat_grad(model, r) for r in range(WORKERS)]
        torch.nn.utils.vector_to_parameters(sum(grads) / WORKERS, [p.grad for p in model.parameters()])
        adam.step()
    torch.testing.assert_close(got, _flat(model), rtol=0, atol=1e-5)
