"""Momentum correction (Lin et al. 2018, "Deep Gradient Compression", ICLR, Sec. 3.2 and Algorithm 1 of
its appendix) on real shards (zmq, 2 shards served from threads, 2 sync workers in threads), against the
paper's algorithm written out here in one process: each worker keeps its velocity u <- m u + g (torch's
SGD momentum; Nesterov: the direction g + m u; weight decay added to g), accumulates it into its
residual, sends the codec's part of it and keeps the rest; with momentum factor masking top-k also
zeroes the velocity where it sent; the shards average and take plain SGD. Warm-up training (Sec. 3.3):
over the first W pushes top-k's ratio is RATIO^((s+1)/5) in stage s = floor(4 clock / W) of four, as
DGC's code computes its warm-up epochs' ratios. Scaled sign with either scale (--sign-scale). With
--no-momentum-correction the shards' momentum takes the mean of the compressed gradients, as before."""
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
WORKERS, SHARDS, STEPS, LR, MOMENTUM, CHUNK = 2, 2, 8, 0.05, 0.9, 1024


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # 2,560 + 40 + 40 + 1 parameters: two sign chunks and more
    return torch.nn.Sequential(torch.nn.Linear(64, 40), torch.nn.Tanh(), torch.nn.Linear(40, 1))


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(16, 64, generator=g), torch.randn(16, 1, generator=g)


def _flat_grad(model: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    model.zero_grad()
    x, y = _data(rank, step)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _ranges() -> list[tuple[int, int]]:
    return PartitionPlan.from_module(_model(), SHARDS).ranges


def _dense_mask(min_numel: int) -> torch.Tensor:
    return torch.cat([torch.full((p.numel(),), p.numel() < min_numel) for p in _model().parameters()])


def warm(ratio: float, warmup: int, clock: int) -> float:
    """DGC's warm-up: four stages over the first `warmup` pushes, stage s sending RATIO^((s+1)/5)."""
    return ratio ** ((4 * clock // warmup + 1) / 5) if clock < warmup else ratio


def topk(ratio: float, warmup: int = 0):
    """Top-k of each shard range (k from the warm-up's ratio at this clock), chosen among the elements
    not sent dense; (sent, where chosen)."""
    def codec(x: torch.Tensor, dense: torch.Tensor, clock: int) -> tuple[torch.Tensor, torch.Tensor]:
        sent, chosen = torch.where(dense, x, torch.zeros_like(x)), torch.zeros_like(dense)
        for lo, hi in _ranges():
            pool = (~dense[lo:hi]).nonzero().view(-1) + lo
            k = math.ceil(warm(ratio, warmup, clock) * pool.numel())
            pick = pool[x[pool].abs().topk(k).indices]
            sent[pick], chosen[pick] = x[pick], True
        return sent, chosen
    return codec


def sign(scale: str):
    """Scaled sign per chunk of 1024 of each shard range, +1 for x >= 0, times the chunk's root mean square
    (l2: 1-bit Adam's, Tang et al. 2021) or mean |x| (l1: EF-SignSGD's, Karimireddy et al. 2019); no masking."""
    def codec(x: torch.Tensor, dense: torch.Tensor, clock: int) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty_like(x)
        for lo, hi in _ranges():
            for a in range(lo, hi, CHUNK):
                b = min(a + CHUNK, hi)
                s = x[a:b].square().mean().sqrt() if scale == "l2" else x[a:b].abs().mean()
                out[a:b] = s * torch.where(x[a:b] >= 0, 1.0, -1.0)
        return torch.where(dense, x, out), torch.zeros_like(dense)
    return codec


def dgc_reference(codec, min_numel: int, *, masking: bool, nesterov: bool = False,
                  weight_decay: float = 0.0) -> torch.Tensor:
    """The weights after STEPS sync steps of DGC's momentum correction (and masking), averaged over WORKERS."""
    model = _model()
    dense = _dense_mask(min_numel)
    velocity = [torch.zeros(dense.numel()) for _ in range(WORKERS)]
    residual = [torch.zeros(dense.numel()) for _ in range(WORKERS)]
    for step in range(STEPS):
        w = _flat(model)
        sent = []
        for r in range(WORKERS):
            g = _flat_grad(model, r, step) + weight_decay * w
            u = velocity[r] = MOMENTUM * velocity[r] + g
            v = residual[r] + (g + MOMENTUM * u if nesterov else u)
            p, chosen = codec(v, dense, step)
            residual[r] = v - p
            if masking:  # momentum factor masking
                velocity[r] = torch.where(chosen, torch.zeros_like(u), u)
            sent.append(p)
        torch.nn.utils.vector_to_parameters(w - LR * sum(sent) / WORKERS, model.parameters())
    return _flat(model)


def server_momentum_reference(codec, min_numel: int) -> torch.Tensor:
    """EF-SGD's pushes C(g + e) averaged, then the servers' SGD momentum (torch.optim.SGD)."""
    model = _model()
    dense = _dense_mask(min_numel)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    residual = [torch.zeros(dense.numel()) for _ in range(WORKERS)]
    for step in range(STEPS):
        sent = []
        for r in range(WORKERS):
            v = residual[r] + _flat_grad(model, r, step)
            p, _ = codec(v, dense, step)
            residual[r] = v - p
            sent.append(p)
        torch.nn.utils.vector_to_parameters(sum(sent) / WORKERS, [p.grad for p in model.parameters()])
        opt.step()
    return _flat(model)


def run_psrv(compress: str, min_numel: int, *, nesterov: bool = False, weight_decay: float = 0.0,
             **worker) -> tuple[torch.Tensor, list[dict]]:
    """STEPS sync steps of 2 workers (threads) on 2 SGD-momentum shards (threads, zmq); rank 0's final
    weights and each worker's state_dict()."""
    optim = OptimConfig("sgd", lr=LR, momentum=MOMENTUM, nesterov=nesterov, weight_decay=weight_decay)
    servers = [Server(ServerConfig(shard=s, num_shards=SHARDS, workers=WORKERS, mode="sync", optimizer=optim,
                                   bind="tcp://127.0.0.1:0", worker_timeout=30.0)) for s in range(SHARDS)]
    for s in servers:
        s.start()
    models = [_model() for _ in range(WORKERS)]
    states = [None] * WORKERS

    def work(rank: int) -> None:
        ps = psrv.Worker(models[rank], [s.address for s in servers], rank=rank, world_size=WORKERS,
                         timeout=30, compress=compress, compress_min_numel=min_numel, **worker)
        for step in range(STEPS):
            x, y = _data(rank, step)
            torch.nn.functional.mse_loss(models[rank](x), y).backward()
            ps.step()
        states[rank] = ps.state_dict()
        ps.close()

    try:
        each_rank_in_threads(work, WORKERS)
    finally:
        for s in servers:
            s.stop()
            s.join(10)
    return _flat(models[0]), states


# case: compress, the reference's codec, compress_min_numel, the servers' optimizer, the worker's DGC settings
CASES = {"topk-masking": ("topk:0.1", topk(0.1), 1024, {}, {"compress_warmup": 0, "momentum_masking": True}),
         "topk-warmup": ("topk:0.1", topk(0.1, warmup=4), 1024, {}, {"compress_warmup": 4}),
         "sign": ("sign", sign("l2"), 0, {}, {}),  # every tensor compressed: sign's scales cover no dense element
         "sign-l1": ("sign", sign("l1"), 0, {}, {"sign_scale": "l1"}),
         "topk-nesterov-wd-warmup-masking": ("topk:0.1", topk(0.1, warmup=6), 1024,
                                             {"nesterov": True, "weight_decay": 1e-2},
                                             {"compress_warmup": 6, "momentum_masking": True})}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_momentum_correction_equals_deep_gradient_compression(case):
    compress, codec, min_numel, optim, dgc = CASES[case]
    got, states = run_psrv(compress, min_numel, **optim, **dgc)
    want = dgc_reference(codec, min_numel, masking=dgc.get("momentum_masking", False), **optim)
    assert (want - _flat(_model())).abs().max() > 1e-2  # the reference moved
    if not optim:  # the test can tell momentum correction from the servers' momentum
        assert (want - server_momentum_reference(codec, min_numel)).abs().max() > 1e-3
    if compress == "sign":  # and the two scales give other weights
        other = sign("l1" if dgc.get("sign_scale", "auto") == "auto" else "l2")  # auto: l2 here
        assert (want - dgc_reference(other, min_numel, masking=False, **optim)).abs().max() > 1e-4
    if compress.startswith("topk"):  # and the masking and the warm-up each change the weights
        masked = dgc_reference(codec, min_numel, masking=not dgc.get("momentum_masking", False), **optim)
        assert (want - masked).abs().max() > 1e-4
        other = topk(0.1, warmup=0 if dgc["compress_warmup"] else 4)
        assert (want - dgc_reference(other, min_numel, masking=dgc.get("momentum_masking", False),
                                     **optim)).abs().max() > 1e-4
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert all(s["velocity"]["velocity"].abs().sum() > 0 for s in states)


def test_without_momentum_correction_the_servers_momentum_takes_the_compressed_gradients():
    """Warm-up is the codec's: it runs without momentum correction too."""
    got, states = run_psrv("topk:0.1", 1024, momentum_correction=False, compress_warmup=4)
    torch.testing.assert_close(got, server_momentum_reference(topk(0.1, warmup=4), 1024), rtol=0, atol=1e-5)
    assert (got - server_momentum_reference(topk(0.1), 1024)).abs().max() > 1e-4
    assert all(s["velocity"] is None for s in states)
