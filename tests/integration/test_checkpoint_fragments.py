"""A shard's checkpoint holds streaming DiLoCo's per-fragment outer optimizers (psrv/server/fragments.py),
so a --resume goes on with each fragment's optimizer state and lr schedule where they were; a checkpoint
written before it held them still loads, its fragments starting afresh, and the shard says so. Driven by
hand (a ShardService and fake transport, tests/helpers.py RecordingNet): this is about what is restored."""
from __future__ import annotations

import logging

import pytest
import torch

from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import Message, MsgType, encode
from psrv.server.service import ShardService
from tests.helpers import RecordingNet

SIZE = 16
A, B = [[0, 8]], [[8, 16]]  # two fragments of the shard
# lr 1, cosine to 0 over each fragment's 2 updates: 1.0, then 0.5, then 0 from the third on
COSINE = OptimConfig(name="sgd", lr=1.0, momentum=0.0, lr_schedule="warmup_cosine", lr_decay_steps=2)


def config(tmp_path, **kw) -> ServerConfig:
    return ServerConfig(**{"workers": 1, "mode": "async", "optimizer": COSINE, "checkpoint_dir": str(tmp_path), **kw})


def push(svc: ShardService, seq: int, fragment: list) -> None:
    """Worker 0 pushes the pseudo-gradient 1 for every element of `fragment`, on the shard's current weights."""
    n = sum(b - a for a, b in fragment)
    svc.handle(b"peer", encode(Message(MsgType.PUSH, worker=0, seq=seq, clock=seq, base_version=svc.shard.version,
                                       fields={"fragment": fragment}, tensor=torch.ones(n))))
    assert "code" not in svc.transport.out[-1].fields, svc.transport.out[-1].fields


def trained(tmp_path) -> ShardService:
    """Fragment A stepped twice (its schedule decayed to 0 from here), B once (at 0.5 next)."""
    svc = ShardService(config(tmp_path), RecordingNet())
    svc.handle(b"peer", encode(Message(MsgType.HELLO, worker=0, seq=1, fields={
        "plan_hash": "p", "total": SIZE, "num_shards": 1, "shard": 0, "world_size": 1})))
    svc.handle(b"peer", encode(Message(MsgType.INIT, worker=0, seq=2, tensor=torch.zeros(SIZE))))
    for seq, fragment in [(3, A), (4, A), (5, B)]:
        push(svc, seq, fragment)
    assert svc.shard.weights[:8].tolist() == [-1.5] * 8 and svc.shard.weights[8:].tolist() == [-1.0] * 8
    return svc


@pytest.mark.timeout(30)
def test_resume_goes_on_with_each_fragments_schedule(tmp_path):
    svc = trained(tmp_path)
    assert svc.checkpoints.save() is not None
    back = ShardService(config(tmp_path, resume=True), RecordingNet())
    for s in (svc, back):  # the same two pushes, on and after the checkpoint
        push(s, 6, A)
        push(s, 7, B)
    assert back.shard.weights[:8].tolist() == [-1.5] * 8  # A's decayed step is 0 (it was 1.0 after a resume)
    assert back.shard.weights[8:].tolist() == [-1.5] * 8  # B's second step at 0.5
    assert torch.equal(back.shard.weights, svc.shard.weights) and back.shard.version == svc.shard.version == 5


@pytest.mark.timeout(30)
def test_a_checkpoint_without_fragments_loads_and_they_start_afresh(tmp_path, caplog):
    old = trained(tmp_path).state_dict()
    del old["fragments"]  # as a checkpoint written before they were kept
    back = ShardService(config(tmp_path), RecordingNet())
    with caplog.at_level(logging.INFO, logger="psrv.server"):
        back.load_state_dict(old, source="old.ckpt")
    assert any("old.ckpt holds no per-fragment outer optimizers" in r.getMessage() for r in caplog.records)
    push(back, 6, A)  # A's optimizer afresh: its schedule at update 0, lr 1
    assert back.shard.weights[:8].tolist() == [-2.5] * 8 and back.shard.version == 4
