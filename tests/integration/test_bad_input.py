"""Bad input gets an ERROR reply; the server keeps serving and its parameters stay untouched."""
import msgpack
import pytest
import torch

from psrv.client.psclient import PSClient, PSError
from psrv.protocol import PROTOCOL_VERSION, ErrorCode, MsgType, decode
from psrv.partition import ParamSpec, PartitionPlan
from psrv.transport import create_client

PLAN = PartitionPlan((ParamSpec("w", (100, 10)), ParamSpec("b", (10,))), 1)


def header(**over) -> bytes:
    h = {"t": int(MsgType.PUSH), "v": PROTOCOL_VERSION, "w": 0, "s": 10**6, "c": 0, "bv": 0,
         "dt": "float32", "n": PLAN.total * 4}
    h.update(over)
    return msgpack.packb(h)


GRAD = torch.ones(PLAN.total).numpy().tobytes()
CASES = {
    "garbage frames": ([b"\x00\xff\xfe garbage", b"more"], ErrorCode.MALFORMED),
    "truncated header": ([header()[:9], GRAD], ErrorCode.MALFORMED),
    "unknown type": ([header(t=77), GRAD], ErrorCode.UNKNOWN_TYPE),
    "reply type sent as request": ([header(t=int(MsgType.WEIGHTS)), GRAD], ErrorCode.UNKNOWN_TYPE),
    "wrong protocol version": ([header(v=PROTOCOL_VERSION + 1), GRAD], ErrorCode.BAD_VERSION),
    "gradient too short": ([header(n=400), GRAD[:400]], ErrorCode.BAD_TENSOR),
    "gradient too long": ([header(n=len(GRAD) + 40), GRAD + bytes(40)], ErrorCode.BAD_TENSOR),
    "wrong dtype": ([header(dt="float64", n=len(GRAD) * 2), GRAD * 2], ErrorCode.BAD_TENSOR),
    "length disagrees with header": ([header(n=len(GRAD) - 4), GRAD], ErrorCode.BAD_TENSOR),
    "unknown worker id": ([header(w=7), GRAD], ErrorCode.NOT_ALLOWED),
    "NaN gradient": ([header(), torch.full((PLAN.total,), float("nan")).numpy().tobytes()], ErrorCode.NONFINITE),
}


@pytest.fixture
def server(procs):
    _, address = procs.server("server", "--workers", "1", "--mode", "async", "--worker-timeout", "60")
    client = PSClient([address], PLAN, worker=0, world_size=1, timeout=20)
    client.hello()
    client.init(torch.arange(PLAN.total, dtype=torch.float32))
    raw = create_client("zmq", [address])
    yield address, client, raw
    raw.close()
    client.close()


def weights(client) -> torch.Tensor:
    out = torch.empty(PLAN.total)
    client.pull(clock=0, out=out)
    return out


@pytest.mark.timeout(90)
def test_every_bad_message_gets_an_error_and_changes_nothing(server):
    address, client, raw = server
    before = weights(client)
    for name, (frames, code) in CASES.items():
        raw.send(0, frames)
        got = raw.recv(timeout=10)
        assert got is not None, f"{name}: no reply"
        reply = decode(got[1])
        assert reply.type is MsgType.ERROR, name
        assert reply.fields["code"] == code, (name, reply.fields)
        assert reply.fields["message"], name
        assert torch.equal(weights(client), before), f"{name} touched the parameters"
    # and the server still serves a good push (a seq above the refused ones: a refused push is recorded,
    # so its seq and those below it are re-sends)
    raw.send(0, [header(s=10**6 + 1), GRAD])
    reply = decode(raw.recv(timeout=10)[1])
    assert reply.type is MsgType.OK and reply.fields["version"] == 1, reply.fields
    assert not torch.equal(weights(client), before)


@pytest.mark.timeout(60)
def test_plan_hash_mismatch_is_refused_at_hello_naming_both_hashes(server):
    address, client, _ = server
    other = PartitionPlan((ParamSpec("w", (10, 100)), ParamSpec("b", (10,))), 1)  # same size, other model
    intruder = PSClient([address], other, worker=0, world_size=1, timeout=20)
    with pytest.raises(PSError) as info:
        intruder.hello()
    intruder.close()
    assert info.value.code is ErrorCode.PLAN_MISMATCH
    assert PLAN.hash in info.value.message and other.hash in info.value.message
    assert weights(client)[:3].tolist() == [0.0, 1.0, 2.0]
