"""--wire-dtype: the worker pushes bfloat16/float16 gradients, the shard applies them as their float32 value."""
from __future__ import annotations

import pytest
import torch

from psrv.client.psclient import PSClient
from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import Message, MsgType, decode, encode
from psrv.server.optim import FUSED_MIN_ELEMENTS
from psrv.partition import ParamSpec, PartitionPlan
from psrv.server.service import ShardService
from psrv.server.shard import Shard
from psrv.transport.base import ClientTransport
from tests.helpers import RecordingNet

HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("size", [1000, FUSED_MIN_ELEMENTS], ids=["plain", "fused"])
@pytest.mark.parametrize("cfg", [OptimConfig("sgd", lr=0.1, momentum=0.9), OptimConfig("adam", lr=1e-3, momentum=0)],
                         ids=["sgd", "adam"])
def test_shard_applies_a_half_gradient_as_its_float32_value(cfg, size, dtype):
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(size, generator=gen)
    half, full = Shard(size, cfg), Shard(size, cfg)
    half.init(init)
    full.init(init)
    for _ in range(3):
        grad = torch.randn(size, generator=gen).to(dtype)
        half.apply(grad)
        full.apply(grad.float())
    assert torch.equal(half.weights, full.weights)
    half.accumulate(grad)
    full.accumulate(grad.float())
    half.apply_accumulated()
    full.apply_accumulated()
    assert torch.equal(half.weights, full.weights)


def test_the_service_applies_a_bfloat16_push_exactly_as_float32():
    cfg = ServerConfig(workers=1, mode="async", optimizer=OptimConfig("sgd", lr=1.0, momentum=0.0))
    net = RecordingNet()
    svc = ShardService(cfg, net)
    grad = torch.tensor([0.1, -2.5, 3.0e-3, 1.0e4]).bfloat16()
    for seq, msg in enumerate([Message(MsgType.HELLO, fields={"plan_hash": "p", "total": 4, "num_shards": 1,
                                                              "shard": 0, "world_size": 1}),
                               Message(MsgType.INIT, tensor=torch.zeros(4)),
                               Message(MsgType.PUSH, tensor=grad)], start=1):
        msg.seq, msg.worker = seq, 0
        svc.handle(b"peer", encode(msg))
    assert [m.type for m in net.out] == [MsgType.WELCOME, MsgType.OK, MsgType.OK]
    assert torch.equal(svc.shard.weights, -grad.float())


class _Echo(ClientTransport):
    """Answers every request at once: WEIGHTS of zeros, and keeps what was pushed."""

    def __init__(self):
        self.pushed, self.replies = [], []

    def send(self, shard, frames):
        msg = decode([bytes(memoryview(f)) for f in frames])
        if msg.tensor is not None:
            self.pushed.append((msg.tensor, torch.frombuffer(frames[1], dtype=torch.uint8).data_ptr()))
        self.replies.append((shard, encode(Message(MsgType.WEIGHTS, seq=msg.seq, fields={"version": 0},
                                                   tensor=torch.zeros(2)))))

    def recv(self, timeout):
        return self.replies.pop(0) if self.replies else None

    def reconnect(self, shard):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_the_client_pushes_one_cast_per_step_into_a_reused_buffer(dtype):
    plan = PartitionPlan((ParamSpec("w", (4,)),), 2)
    net = _Echo()
    client = PSClient(["a", "b"], plan, worker=0, world_size=1, heartbeat=False, net=net,
                      wire_dtype=str(dtype).removeprefix("torch."))
    out = torch.empty(4)
    grads = [torch.tensor([1.0, 2.0, 3.0, 1 / 3]), torch.tensor([-1.0, 0.5, 1e-3, 7.0])]
    for clock, grad in enumerate(grads):
        client.push_pull(grad, clock=clock, out=out)
    assert all(t.dtype == dtype for t, _ in net.pushed)
    assert torch.equal(torch.cat([t for t, _ in net.pushed[2:]]), grads[1].to(dtype))
    assert net.pushed[0][1] == net.pushed[2][1]  # the same buffer both steps
    with pytest.raises(ValueError, match="wire_dtype"):
        PSClient(["a"], PartitionPlan((ParamSpec("w", (4,)),), 1), worker=0, world_size=1, net=net,
                 wire_dtype="int8")
