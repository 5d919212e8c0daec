"""A compressed push through the wire codec and a shard service: applied as its decoded value (sync
averages them), topk:1.0 exactly as dense, and every malformed one answered ERROR with the
parameters untouched."""
from __future__ import annotations

import pytest
import torch

from psrv.codecs import make
from psrv.codecs.push import PushEncoder
from psrv.config import OptimConfig, ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import ErrorCode, Message, MsgType
from psrv.server.service import ShardService
from tests.helpers import RecordingNet, hand_driven
from tests.helpers import send_to as send

N = 3000


def service(mode: str = "async", workers: int = 1) -> tuple[ShardService, RecordingNet]:
    return hand_driven(ServerConfig(workers=workers, mode=mode, optimizer=OptimConfig("sgd", lr=1.0, momentum=0.0)), N)


def push(svc: ShardService, grad: torch.Tensor, spec: str, *, worker: int = 0, seq: int = 3, mangle=None) -> Message:
    enc = PushEncoder(make(spec), PartitionPlan((ParamSpec("w", (N,)),), 1), error_feedback=False)
    fields, parts = enc.encode(grad, 0)
    if mangle is not None:
        mangle(fields["codec"], parts)
    send(svc, Message(MsgType.PUSH, worker=worker, seq=seq, fields=fields, parts=parts))
    return svc.transport.out[-1]


GRAD = torch.randn(N, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_topk_one_is_applied_exactly_as_the_dense_push(mode):
    dense, _ = service(mode)
    send(dense, Message(MsgType.PUSH, worker=0, seq=3, tensor=GRAD))
    sparse, _ = service(mode)
    assert push(sparse, GRAD, "topk:1.0").type is MsgType.OK
    assert torch.equal(sparse.shard.weights, dense.shard.weights)
    assert torch.equal(sparse.shard.weights, -GRAD)


def test_sync_averages_the_decoded_pushes_of_its_workers():
    svc, _ = service("sync", workers=2)
    other = torch.randn(N, generator=torch.Generator().manual_seed(2))
    push(svc, GRAD, "topk:0.1", worker=0)
    assert svc.shard.version == 0
    push(svc, other, "sign", worker=1)
    topk = torch.where(GRAD.abs() >= GRAD.abs().topk(300).values[-1], GRAD, torch.zeros(N))
    chunks = [other[a:a + 1024] for a in range(0, N, 1024)]
    sign = torch.cat([c.abs().mean() * torch.where(c >= 0, 1.0, -1.0) for c in chunks])
    assert svc.shard.version == 1
    assert torch.allclose(svc.shard.weights, -(topk + sign) / 2, atol=1e-6)


def _drop(name):
    return lambda f, p: p.pop(name)


BAD = {
    "wrong shape": (lambda f, p: f.update(n=N - 1), ErrorCode.BAD_TENSOR),
    "index out of range": (lambda f, p: p["indices"].__setitem__(0, N), ErrorCode.BAD_TENSOR),
    "negative index": (lambda f, p: p["indices"].__setitem__(0, -1), ErrorCode.BAD_TENSOR),
    "lengths disagree": (lambda f, p: p.update(values=p["values"][:-1].clone()), ErrorCode.BAD_TENSOR),
    "indices not int32": (lambda f, p: p.update(indices=p["indices"].float()), ErrorCode.BAD_TENSOR),
    "no values": (_drop("values"), ErrorCode.BAD_TENSOR),
    "unknown codec": (lambda f, p: f.update(name="lz4"), ErrorCode.MALFORMED),
    "too many indices": (lambda f, p: p.update(indices=torch.zeros(N + 1, dtype=torch.int32),
                                               values=torch.zeros(N + 1)), ErrorCode.BAD_TENSOR),
    "nan value": (lambda f, p: p["values"].__setitem__(0, float("nan")), ErrorCode.NONFINITE),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_a_malformed_sparse_push_is_refused_and_changes_nothing(case):
    svc, _ = service()
    before = svc.shard.weights.clone()
    mangle, code = BAD[case]
    reply = push(svc, GRAD, "topk:0.01", mangle=mangle)
    assert reply.type is MsgType.ERROR and reply.fields["code"] == code, reply.fields
    assert torch.equal(svc.shard.weights, before) and svc.shard.version == 0


BAD_CHUNKED = {
    "sign: bits short": ("sign", lambda f, p: p.update(bits=p["bits"][:-1].clone())),
    "sign: scales short": ("sign", lambda f, p: p.update(scales=p["scales"][:-1].clone())),
    "sign: chunk zero": ("sign", lambda f, p: f.update(chunk=0)),
    "int8: wrong shape": ("int8", lambda f, p: f.update(n=N + 1)),
    "int8: q as uint8": ("int8", lambda f, p: p.update(q=p["q"].view(torch.uint8))),
    "dense range outside": ("topk:0.01", lambda f, p: (f.update(dense=[[N - 2, N + 2]]),
                                                      p.update(dense=torch.zeros(4)))),
    "dense lengths disagree": ("topk:0.01", lambda f, p: (f.update(dense=[[0, 4]]), p.update(dense=torch.zeros(3)))),
}


@pytest.mark.parametrize("case", list(BAD_CHUNKED), ids=list(BAD_CHUNKED))
def test_a_malformed_push_of_the_other_codecs_is_refused(case):
    svc, _ = service()
    spec, mangle = BAD_CHUNKED[case]
    reply = push(svc, GRAD, spec, mangle=mangle)
    assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.BAD_TENSOR, reply.fields
    assert not svc.shard.weights.any() and svc.shard.version == 0
