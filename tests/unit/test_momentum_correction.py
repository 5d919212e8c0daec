"""Momentum correction's two halves apart: a shard steps a velocity push with plain SGD (no momentum
buffer, no weight decay of its own) and refuses what does not fit (a sync clock mixing velocities and
gradients, an optimizer or update rule that needs the raw gradient, sync's clip); a worker keeps the
velocity only where a lossy codec meets SGD momentum, and refuses, before its first push, servers
whose settings need gradients."""
from __future__ import annotations

import pytest
import torch

from psrv.config import OptimConfig, ServerConfig, WorkerSettings
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import ErrorCode, Message, MsgType, encode
from psrv.server.service import ShardService
from tests.helpers import RecordingNet
from tests.inproc import InProcess

N = 8


def service(optim: OptimConfig, *, mode: str = "async", workers: int = 1) -> ShardService:
    svc = ShardService(ServerConfig(workers=workers, mode=mode, optimizer=optim), RecordingNet())
    for w in range(workers):
        send(svc, Message(MsgType.HELLO, worker=w, seq=1, fields={
            "plan_hash": "p", "total": N, "num_shards": 1, "shard": 0, "world_size": workers}))
    send(svc, Message(MsgType.INIT, worker=0, seq=2, tensor=torch.ones(N)))
    return svc


def send(svc: ShardService, msg: Message) -> Message:
    svc.handle(msg.worker, encode(msg))
    return svc.transport.out[-1]


def push(svc: ShardService, values: torch.Tensor, *, worker: int = 0, seq: int = 3, clock: int = 0,
         velocity: bool = True) -> Message:
    fields = {"velocity": True} if velocity else {}
    return send(svc, Message(MsgType.PUSH, worker=worker, seq=seq, clock=clock, fields=fields, tensor=values))


V1, V2 = torch.arange(N, dtype=torch.float32), torch.linspace(-1, 1, N)
SGD = OptimConfig("sgd", lr=0.5, momentum=0.9, weight_decay=0.1)


def test_a_velocity_push_is_stepped_without_the_shards_momentum_or_weight_decay():
    svc = service(SGD)
    assert push(svc, V1).type is MsgType.OK and push(svc, V2, seq=4).type is MsgType.OK
    torch.testing.assert_close(svc.shard.weights, 1 - 0.5 * (V1 + V2), rtol=0, atol=1e-6)
    assert "momentum_buffer" not in svc.shard.optimizer.state  # the shard kept no momentum
    welcome = svc.transport.out[0].fields["optimizer"]
    assert welcome == {"name": "sgd", "momentum": 0.9, "nesterov": False, "weight_decay": 0.1, "update_rule": "plain"}


def test_a_sync_clock_of_velocities_steps_their_mean():
    svc = service(SGD, mode="sync", workers=2)
    push(svc, V1, worker=0)
    push(svc, V2, worker=1)
    assert svc.shard.version == 1
    torch.testing.assert_close(svc.shard.weights, 1 - 0.5 * (V1 + V2) / 2, rtol=0, atol=1e-6)


@pytest.mark.parametrize("first", [True, False], ids=["velocity-first", "gradient-first"])
def test_a_sync_clock_mixing_velocities_and_gradients_is_refused(first):
    svc = service(SGD, mode="sync", workers=2)
    push(svc, V1, worker=0, velocity=first)
    reply = push(svc, V2, worker=1, velocity=not first)
    assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.NOT_ALLOWED, reply.fields
    assert "--no-momentum-correction" in reply.fields["message"]
    assert svc.shard.version == 0 and torch.equal(svc.shard.weights, torch.ones(N))


@pytest.mark.parametrize("optim,mode", [
    (OptimConfig("adam", lr=0.1), "async"),
    (OptimConfig("sgd", lr=0.1, momentum=0.9, update_rule="dc-asgd"), "async"),
    (OptimConfig("sgd", lr=0.1, momentum=0.9, nesterov=True, update_rule="dn"), "async"),
    (OptimConfig("sgd", lr=0.1, momentum=0.9, clip_grad_norm=1.0), "sync"),
], ids=["adam", "dc-asgd", "dn", "sync-clip"])
def test_a_velocity_push_is_refused_where_the_shard_needs_the_gradient(optim, mode):
    svc = service(optim, mode=mode)
    reply = push(svc, V1)
    assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.NOT_ALLOWED, reply.fields
    assert "--no-momentum-correction" in reply.fields["message"]
    assert svc.shard.version == 0 and torch.equal(svc.shard.weights, torch.ones(N))


def _client(optim: OptimConfig, mode: str = "sync", **kw):
    shards = 1 if optim.clip_grad_norm else 2  # sync's clip needs one shard
    cluster = InProcess([ServerConfig(shard=s, num_shards=shards, workers=1, mode=mode, optimizer=optim)
                         for s in range(shards)])
    client = cluster.client(0, PartitionPlan((ParamSpec("w", (64,)),), shards), **kw)
    return cluster, client


@pytest.mark.parametrize("optim,compress,on", [
    (OptimConfig("sgd", lr=0.1, momentum=0.9), "topk:0.1", True),
    (OptimConfig("sgd", lr=0.1, momentum=0.9), "int8", True),
    (OptimConfig("sgd", lr=0.1, momentum=0.0), "topk:0.1", False),  # no momentum to correct
    (OptimConfig("sgd", lr=0.1, momentum=0.9), "", False),  # dense pushes: the servers' momentum is exact
    (OptimConfig("sgd", lr=0.1, momentum=0.9), "float16", False),  # a cast, no error feedback
    (OptimConfig("adam", lr=0.1), "topk:0.1", False),
], ids=["topk", "int8", "no-momentum", "dense", "float16", "adam"])
def test_the_worker_keeps_a_velocity_where_a_lossy_codec_meets_sgd_momentum(optim, compress, on):
    _, client = _client(optim, compress=compress)
    client.hello()
    assert (client.velocity is not None) == on
    _, no_feedback = _client(optim, compress=compress, error_feedback=False)  # no residual to correct
    no_feedback.hello()
    assert no_feedback.velocity is None
    _, off = _client(optim, compress=compress, momentum_correction=False)
    off.hello()
    assert off.velocity is None


@pytest.mark.parametrize("optim,mode", [
    (OptimConfig("sgd", lr=0.1, momentum=0.9, update_rule="dc-asgd"), "async"),
    (OptimConfig("sgd", lr=0.1, momentum=0.9, clip_grad_norm=1.0), "sync"),
], ids=["dc-asgd", "sync-clip"])
def test_the_worker_refuses_servers_that_need_gradients_and_leaves(optim, mode):
    cluster, client = _client(optim, mode=mode, compress="topk:0.1")
    with pytest.raises(ValueError, match="--no-momentum-correction"):
        client.hello()
    assert all(not s.controller.active for s in cluster.services)  # it left: no barrier waits for it
    _, without = _client(optim, mode=mode, compress="topk:0.1", momentum_correction=False)
    without.hello()


def test_it_is_a_worker_setting_on_by_default():
    assert WorkerSettings().momentum_correction is True
    assert WorkerSettings(momentum_correction=False).momentum_correction is False
