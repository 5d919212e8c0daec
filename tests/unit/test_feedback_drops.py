"""Error feedback when a push is not applied, on real shard services and real PSClients in one
thread (tests/inproc.py), so the order pushes arrive in is the test's:

- a non-finite gradient slice goes raw and leaves the worker's state (residual, onebit_adam's
  momentum) as it was: it costs exactly that one push, and every later push is applied and finite;
- a push a shard drops (late in sync with backup workers) leaves the residual owed from earlier
  pushes: the run equals EF-SGD (Karimireddy et al. 2019) written out here, e <- g + e - C(g + e)
  on the pushes applied only, shard by shard; with SGD momentum, momentum correction's velocity
  (Lin et al. 2018) likewise moves on with the applied pushes only."""
from __future__ import annotations

import math

import pytest
import torch

from psrv.config import OptimConfig, ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import ErrorCode
from psrv.client.roundtrip import PSError
from tests.inproc import InProcess

N, SHARDS = 4096, 2  # two shards of 2048: two sign / int8 chunks each
PLAN = PartitionPlan((ParamSpec("w", (N,)),), SHARDS)
LR = 0.1


def _cfgs(workers: int, mode: str, optim: OptimConfig, **kw) -> list[ServerConfig]:
    return [ServerConfig(shard=s, num_shards=SHARDS, workers=workers, mode=mode, optimizer=optim, **kw)
            for s in range(SHARDS)]


def _grad(w: torch.Tensor, worker: int, step: int) -> torch.Tensor:
    """A quadratic's gradient at w (each worker its own minimum) plus seeded noise."""
    g = torch.Generator().manual_seed(1000 * worker + step)
    target = torch.randn(w.numel(), generator=torch.Generator().manual_seed(7 + worker))
    return (w - target) + 0.3 * torch.randn(w.numel(), generator=g)


def _start(cluster: InProcess, workers: int, **kw):
    clients = [cluster.client(r, PLAN, **kw) for r in range(workers)]
    welcomes = [c.hello() for c in clients]
    weights = [torch.zeros(N) for _ in clients]
    clients[0].init(torch.zeros(N))
    for c, w, welcome in zip(clients, weights, welcomes):
        c.first_pull(welcome, out=w)
    return clients, weights


def _dropped(reply) -> list[str | None]:
    return [f.get("push", f).get("dropped") for f in reply.fields]


@pytest.mark.parametrize("codec,momentum", [("topk:0.01", 0.0), ("sign", 0.0), ("int8", 0.0), ("topk:0.01", 0.9)],
                         ids=["topk", "sign", "int8", "topk-momentum-correction"])
def test_one_nonfinite_gradient_costs_exactly_one_push(codec, momentum):
    """async, --nonfinite skip: a NaN in shard 0's slice at step 3 is dropped there, once; shard 1
    applies that push; every other push is applied; the residual (and with SGD momentum, momentum
    correction's velocity) stays finite."""
    cluster = InProcess(_cfgs(1, "async", OptimConfig("sgd", lr=LR, momentum=momentum), nonfinite="skip"))
    (client,), (w,) = _start(cluster, 1, compress=codec, compress_min_numel=0)
    drops = []
    for step in range(10):
        grad = _grad(w, 0, step)
        if step == 3:
            grad[5] = float("nan")
        reply = client.push_pull(grad, clock=step, out=w)
        drops += [(step, s, d) for s, d in enumerate(_dropped(reply)) if d]
    assert drops == [(3, 0, "nonfinite")]
    assert torch.isfinite(client.encoder.error).all() and torch.isfinite(w).all()
    assert (client.velocity is not None) == bool(momentum)
    assert client.velocity is None or torch.isfinite(client.velocity.velocity).all()
    shard0, shard1 = cluster.summaries()
    assert shard0["dropped"] == {"invalid": 1} and shard0["updates_applied"] == 9, shard0
    assert shard1["dropped"] == {} and shard1["updates_applied"] == 10, shard1


@pytest.mark.parametrize("at", [1, 3], ids=["warm-up", "after-freeze"])
def test_one_nonfinite_gradient_under_onebit_adam_costs_exactly_one_push(at):
    """sync onebit_adam (freeze at 2), --nonfinite skip: a NaN gradient at step `at` is dropped by every
    shard, its clock moves on without a step (the only worker's push was no gradient), and from then on
    every push is applied and finite: neither its local momentum nor its residual took the NaN."""
    optim = OptimConfig("onebit_adam", lr=0.01, freeze_step=2)
    cluster = InProcess(_cfgs(1, "sync", optim, nonfinite="skip"))
    (client,), (w,) = _start(cluster, 1, compress_min_numel=0)
    drops = []
    for step in range(8):
        grad = _grad(w, 0, step)
        if step == at:
            grad[5] = grad[N - 5] = float("nan")  # one in each shard's slice
        reply = client.push(grad, clock=step)
        drops += [(step, s, d) for s, d in enumerate(_dropped(reply)) if d]
        client.pull(clock=step + 1, out=w)
    assert drops == [(at, 0, "nonfinite"), (at, 1, "nonfinite")]
    assert torch.isfinite(client.onebit.momentum).all() and torch.isfinite(client.encoder.error).all()
    assert torch.isfinite(w).all()
    assert all(s["dropped"] == {"invalid": 1} and s["updates_applied"] == 7 for s in cluster.summaries())


def test_one_nonfinite_gradient_is_refused_once_under_reject():
    """async, --nonfinite reject: the NaN push is answered ERROR NONFINITE, and only that one."""
    cluster = InProcess(_cfgs(1, "async", OptimConfig("sgd", lr=LR, momentum=0.0)))
    (client,), (w,) = _start(cluster, 1, compress="topk:0.01", compress_min_numel=0)
    errors = []
    for step in range(8):
        grad = _grad(w, 0, step)
        if step == 3:
            grad[5] = float("nan")
        try:
            client.push_pull(grad, clock=step, out=w)
        except PSError as exc:
            errors.append((step, exc.shard, exc.code))
    assert errors == [(3, 0, ErrorCode.NONFINITE)]
    assert torch.isfinite(client.encoder.error).all()
    assert [s["errors"] for s in cluster.summaries()] == [1, 0]


# --- a dropped push keeps the residual -------------------------------------------------------------
RATIO, WORKERS, STEPS = 0.25, 3, 6
SMALL = PartitionPlan((ParamSpec("w", (64,)),), SHARDS)  # 32 elements a shard, top-k keeps 8
# the order each shard hears the workers in, step by step; with one backup worker the third is late
ORDERS = [([0, 1, 2], [2, 0, 1]), ([1, 2, 0], [1, 2, 0]), ([0, 1, 2], [0, 1, 2]),
          ([2, 0, 1], [0, 2, 1]), ([0, 2, 1], [1, 0, 2]), ([1, 0, 2], [2, 1, 0])]


def _small_grad(w: torch.Tensor, worker: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * worker + step)
    target = torch.randn(w.numel(), generator=torch.Generator().manual_seed(7 + worker))
    return (w - target) * (1 + worker) + 0.3 * torch.randn(w.numel(), generator=g)


def _topk(x: torch.Tensor) -> torch.Tensor:
    k = math.ceil(RATIO * x.numel())
    out = torch.zeros_like(x)
    idx = x.abs().topk(k).indices
    out[idx] = x[idx]
    return out


def ef_sgd_reference(*, keep_on_drop: bool = True, momentum: float = 0.0) -> torch.Tensor:
    """EF-SGD over the shard ranges, a clock's applied pushes averaged: per worker and shard range
    p = C(g + e), e <- g + e - p when the push is applied; when it is late, e stays (keep_on_drop) or,
    as before the fix, moves on anyway. With momentum, DGC's momentum correction: g is replaced by the
    velocity u' = m u + g, and u <- u' zeroed where top-k sent, when the push is applied."""
    w = torch.zeros(SMALL.total)
    errors = [torch.zeros(SMALL.total) for _ in range(WORKERS)]
    velocity = [torch.zeros(SMALL.total) for _ in range(WORKERS)]
    for step, orders in enumerate(ORDERS):
        grads = [_small_grad(w, r, step) for r in range(WORKERS)]
        new = w.clone()
        for (lo, hi), order in zip(SMALL.ranges, orders):
            applied = order[:WORKERS - 1]
            sent = []
            for r in range(WORKERS):
                u = momentum * velocity[r][lo:hi] + grads[r][lo:hi]
                x = u + errors[r][lo:hi]
                p = _topk(x)
                if r in applied or not keep_on_drop:
                    errors[r][lo:hi] = x - p
                    velocity[r][lo:hi] = torch.where(p != 0, torch.zeros_like(u), u)
                if r in applied:
                    sent.append(p)
            new[lo:hi] = w[lo:hi] - LR * sum(sent) / len(sent)
        w = new
    return w


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["sgd", "momentum-correction"])
def test_a_late_push_keeps_the_residual_owed_from_earlier_pushes(momentum):
    """sync, 3 workers, 1 backup worker, 2 shards, top-k 25% with error feedback, each shard hearing
    the workers in its own order (ORDERS): the weights equal the EF-SGD reference to 1e-6 (with SGD
    momentum 0.9: momentum correction's, with momentum factor masking)."""
    cfgs = _cfgs(WORKERS, "sync", OptimConfig("sgd", lr=LR, momentum=momentum), backup_workers=1)
    cluster = InProcess(cfgs)
    clients = [cluster.client(r, SMALL, compress=f"topk:{RATIO}", compress_min_numel=0, momentum_masking=True,
                              compress_warmup=0)
               for r in range(WORKERS)]
    welcomes = [c.hello() for c in clients]
    weights = [torch.zeros(SMALL.total) for _ in clients]
    clients[0].init(torch.zeros(SMALL.total))
    for c, w, welcome in zip(clients, weights, welcomes):
        c.first_pull(welcome, out=w)
    late = []
    for step, orders in enumerate(ORDERS):
        pushing = [c.begin_push_pull(_small_grad(w, r, step), clock=step, out=w)
                   for r, (c, w) in enumerate(zip(clients, weights))]
        for s, order in enumerate(orders):
            for r in order:
                pushing[r].ready(s)
        for r, p in enumerate(pushing):
            late += [(step, s, r) for s, d in enumerate(_dropped(p.finish())) if d == "late"]
    assert sorted(late) == sorted((step, s, order[-1]) for step, orders in enumerate(ORDERS)
                                  for s, order in enumerate(orders))
    want = ef_sgd_reference(momentum=momentum)
    assert (want - ef_sgd_reference(keep_on_drop=False, momentum=momentum)).abs().max() > 1e-3  # they differ
    for w in weights:
        torch.testing.assert_close(w, want, rtol=0, atol=1e-6)
