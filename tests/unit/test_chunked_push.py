"""A push applied chunk by chunk (psrv/server/pushes/chunked.py) is the push applied whole: torch.optim's
math on views of the flat parameter and its state, element by element, the step count the push's."""
from __future__ import annotations

import pytest
import torch

from psrv.chunking import ALIGN, chunk_count, chunk_range
from psrv.config import OptimConfig
from psrv.server.rules import PushContext
from psrv.server.shard import Shard


@pytest.mark.parametrize("size", [1, 2, 7, 10, 99, 1000, 1001, 70_000])
@pytest.mark.parametrize("limit", [1, 3, 64, 100, 5000])
def test_chunks_cover_the_push_once_in_order(size, limit):
    n = chunk_count(size, limit)
    ranges = [chunk_range(size, n, i) for i in range(n)]
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(0 < hi - lo <= -(-limit // ALIGN) * ALIGN for lo, hi in ranges)
    assert all(lo % ALIGN == 0 for lo, _ in ranges)  # torch's vector loops see each element as in the whole
    assert (n == 1) == (size <= max(limit, ALIGN))


OPTIMS = [OptimConfig(name="sgd", lr=0.1), OptimConfig(name="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
          OptimConfig(name="adam", lr=0.01), OptimConfig(name="adamw", lr=0.01, weight_decay=0.1),
          OptimConfig(name="sgd", lr=0.1, momentum=0.5, update_rule="staleness-lr")]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("optim", OPTIMS, ids=lambda o: f"{o.name}-{o.update_rule}-{o.momentum}")
def test_a_push_in_chunks_steps_as_the_whole_push(optim, fused):
    size, n = 1000, 3
    whole, chunked = Shard(size, optim), Shard(size, optim)
    for s in (whole, chunked):
        s.optimizer.fused = fused
        s.init(torch.linspace(-1, 1, size))
    gen = torch.Generator().manual_seed(0)
    for step in range(4):
        grad = torch.randn(size, generator=gen)
        if step == 2:
            grad = grad.to(torch.bfloat16)  # a wire dtype: widened into the shard's float32 scratch
        ctx = PushContext(worker=0, clock=step, base_version=max(0, step - 2), staleness=min(step, 2))
        whole.apply(grad, ctx)
        for i in reversed(range(n)):  # any order: each chunk is its own elements
            lo, hi = chunk_range(size, n, i)
            chunked.apply_slice(grad[lo:hi], lo, hi, ctx)
        chunked.end_slices()
    assert chunked.version == whole.version == 4
    assert torch.equal(chunked.weights, whole.weights)
    a, b = whole.optimizer.state_dict()["state"], chunked.optimizer.state_dict()["state"]
    assert a.keys() == b.keys()
    for k, v in a.get(0, {}).items():
        assert torch.equal(v, b[0][k]), k
