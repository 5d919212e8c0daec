"""A push is applied whole or not at all, counted once, at its own step and lr: chunked pushes
(psrv/server/pushes/chunked.py) from two workers whose chunks interleave, a chunked push that carries a NaN,
a worker that leaves half-way, and a non-finite push skipped under sync. The shard is driven by hand
(tests/helpers.RecordingNet keeps every reply), so the order of the messages is the test's."""
from __future__ import annotations

import pytest
import torch

from psrv.chunking import chunk_range
from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import Message, MsgType, encode
from psrv.server.service import ShardService
from tests.helpers import RecordingNet

SIZE, CHUNKS = 1000, 3


class Driven:
    """One shard served by hand: `send(worker, type, ...)` hands it one message from that worker."""

    def __init__(self, mode: str = "async", workers: int = 2, nonfinite: str = "reject", optim: OptimConfig | None = None,
                 now=None, **server):
        cfg = ServerConfig(workers=workers, mode=mode, nonfinite=nonfinite, worker_timeout=1e6,
                           optimizer=optim or OptimConfig(name="adam", lr=0.01), **server)
        self.net = RecordingNet()
        self.svc = ShardService(cfg, self.net, join_timeout=1e6, **({} if now is None else {"now": now}))
        self.seq = {w: 10 for w in range(workers)}
        hello = {"plan_hash": "p", "total": SIZE, "num_shards": 1, "shard": 0, "world_size": workers}
        for w in range(workers):
            self.send(w, MsgType.HELLO, fields=hello)
        self.send(0, MsgType.INIT, tensor=torch.linspace(-1, 1, SIZE))
        self.net.out.clear()

    def send(self, worker: int, mtype: MsgType, *, seq: int | None = None, **kw) -> None:
        if seq is None:
            self.seq[worker] += 1
            seq = self.seq[worker]
        self.svc.handle(("peer", worker), encode(Message(mtype, worker=worker, seq=seq, **kw)))

    def chunk(self, worker: int, grad: torch.Tensor, i: int, *, seq: int, clock: int = 0) -> None:
        lo, hi = chunk_range(SIZE, CHUNKS, i)
        self.send(worker, MsgType.PUSH, seq=seq, clock=clock, fields={"chunk": [i, CHUNKS]}, tensor=grad[lo:hi])

    @property
    def weights(self) -> torch.Tensor:
        return self.svc.shard.weights.clone()

    def counts(self) -> tuple:
        s = self.svc.summary()
        return s["pushes"], s["updates_applied"], s["dropped"], s["version"]


def grads(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(SIZE, generator=gen) for _ in range(n)]


def test_interleaved_chunked_pushes_step_as_the_whole_pushes_in_order():
    """Two workers' chunks alternate (A0 B0 A1 B1 A2 B2): each push takes its own Adam step count and
    lr, as whole pushes A then B do; bit for bit."""
    a, b = grads(2)
    whole, chunked = Driven(), Driven()
    whole.send(0, MsgType.PUSH, clock=0, tensor=a)
    whole.send(1, MsgType.PUSH, clock=0, tensor=b)
    for i in range(CHUNKS):
        chunked.chunk(0, a, i, seq=50)
        chunked.chunk(1, b, i, seq=50)
    assert chunked.counts() == whole.counts() == (2, 2, {}, 2)
    gap = (chunked.weights - whole.weights).abs().max().item()
    assert torch.equal(chunked.weights, whole.weights), f"weights differ by {gap:.3g}"
    s1, s2 = whole.svc.shard.optimizer.state, chunked.svc.shard.optimizer.state
    assert all(torch.equal(s1[k], s2[k]) for k in s1), "optimizer state differs"
    answered = [m.fields.get("version") for m in chunked.net.out]
    assert answered == [1, 2], f"each push answered once, in order, after its own update: {answered}"


@pytest.mark.parametrize("nonfinite", ["reject", "skip"])
def test_a_chunked_push_with_a_nan_is_refused_and_counted_once(nonfinite):
    """A peer that sends a NaN in its last chunk, after two chunks were applied (psrv's client never does:
    it sends a non-finite push whole). The push is refused and counted once, in dropped; the shard says
    what it could not undo."""
    g = grads(1)[0]
    bad = g.clone()
    bad[chunk_range(SIZE, CHUNKS, CHUNKS - 1)[0] + 3] = float("nan")
    d = Driven(nonfinite=nonfinite)
    for i in range(CHUNKS):
        d.chunk(0, bad, i, seq=50)
    pushes, applied, dropped, version = d.counts()
    assert (pushes, applied, dropped) == (1, 0, {"invalid": 1}), (pushes, applied, dropped)
    s = d.svc.summary()
    assert s["partially_applied"] == 1 and version == applied + s["partially_applied"], s
    reply = d.net.out[-1]
    assert reply.type is MsgType.ERROR and "refused" in reply.fields["message"], reply.fields
    d.net.out.clear()
    for i in range(CHUNKS):  # re-sent: answered from the table, never applied again
        d.chunk(0, bad, i, seq=50)
    assert d.counts()[:3] == (1, 0, {"invalid": 1}) and d.svc.summary()["duplicates"] == 1


def test_a_push_left_half_way_is_counted_once():
    g = grads(1)[0]
    d = Driven()
    d.chunk(0, g, 0, seq=50)
    d.send(0, MsgType.LEAVE)
    pushes, applied, dropped, version = d.counts()
    assert (pushes, applied, dropped) == (1, 0, {"partial": 1}), (pushes, applied, dropped)
    assert version == d.svc.summary()["partially_applied"] == 1


def test_sync_skips_a_nonfinite_push_and_steps_on_the_others():
    """--nonfinite skip under sync: the NaN push is acknowledged and dropped, the clock is applied with
    the mean of the finite gradients (as a backup worker's late one is left out), and no one waits."""
    g = grads(1)[0]
    nan = torch.full((SIZE,), float("nan"))
    d = Driven(mode="sync", nonfinite="skip", optim=OptimConfig(name="sgd", lr=0.1, momentum=0.0))
    start = d.weights
    d.send(0, MsgType.PUSH_PULL, clock=0, tensor=nan)
    d.send(1, MsgType.PUSH_PULL, clock=0, tensor=g)
    weights = [m for m in d.net.out if m.type is MsgType.WEIGHTS]
    assert len(weights) == 2, f"both pulls answered: {[m.type.name for m in d.net.out]}"
    assert weights[0].fields["push"].get("dropped") == "nonfinite"
    assert torch.allclose(d.weights, start - 0.1 * g, atol=1e-6)
    assert d.counts() == (2, 1, {"invalid": 1}, 1)


def test_sync_with_every_push_nonfinite_moves_to_the_next_clock_without_a_step():
    nan = torch.full((SIZE,), float("nan"))
    d = Driven(mode="sync", nonfinite="skip", optim=OptimConfig(name="sgd", lr=0.1, momentum=0.9))
    start = d.weights
    for w in (0, 1):
        d.send(w, MsgType.PUSH_PULL, clock=0, tensor=nan)
    weights = [m for m in d.net.out if m.type is MsgType.WEIGHTS]
    assert len(weights) == 2 and all(m.fields["clock"] == 1 for m in weights), [m.fields for m in weights]
    assert torch.equal(d.weights, start)
    assert d.counts() == (2, 0, {"invalid": 2}, 0)
