"""Fuzzing a live shard with chunked pushes (psrv/server/pushes/chunked.py): seeded chunks whose `chunk`
field, tensor or header is wrong, over real ZeroMQ. A chunk is part of one request (its push), which
is answered once, at its last chunk: so a well-formed chunk that is not its push's last gets no reply,
and every other gets exactly one, never an INTERNAL error. The shard keeps serving and its parameters
never change (the harness's worker pushed with the top seq, so every fuzzed push is a re-sent one).
"""
from __future__ import annotations

import random

import msgpack
import pytest
import torch

from psrv.chunking import chunk_range
from psrv.protocol import ErrorCode, Message, MsgType, decode, encode
from tests.integration.test_fuzz import SIZE, Harness, mutate_header, odd_value

MESSAGES = 2_000


def chunk_frames(n: int, i: int, mtype: MsgType = MsgType.PUSH, seq: int = 5) -> list[bytes]:
    lo, hi = chunk_range(SIZE, n, i)
    msg = Message(mtype, worker=0, seq=seq, clock=3, base_version=1, fields={"chunk": [i, n]},
                  tensor=torch.full((hi - lo,), 0.25))
    return [bytes(memoryview(f).cast("B")) for f in encode(msg)]


def well_formed_nonlast(frames: list[bytes]) -> bool:
    """Could this be a valid chunk that is not its push's last (answered by nothing but its push's end)?"""
    try:
        h = msgpack.unpackb(frames[0])
        spec = h["f"]["chunk"]
        return h["t"] in (MsgType.PUSH.value, MsgType.PUSH_PULL.value, MsgType.INIT.value) and spec[0] < spec[1] - 1
    except Exception:
        return False


def bad_chunk(rng: random.Random) -> list[bytes]:
    n = rng.choice([2, 3, 4])
    frames = chunk_frames(n, rng.randrange(n), rng.choice([MsgType.PUSH, MsgType.PUSH_PULL, MsgType.INIT]))
    h = msgpack.unpackb(frames[0])
    kind = rng.randrange(5)
    if kind == 0:
        h["f"]["chunk"] = odd_value(rng) if rng.random() < 0.5 else [odd_value(rng), odd_value(rng)]
    elif kind == 1:  # an index or count out of range
        h["f"]["chunk"] = rng.choice([[n, n], [-1, n], [0, 1], [0, 0], [0, SIZE + 1], [SIZE, SIZE], [1, 2, 3]])
    elif kind == 2:  # the tensor of another chunk's length
        body = torch.ones(rng.choice([0, 1, SIZE // n + 2, SIZE])).numpy().tobytes()
        h["n"] = len(body)
        frames[1] = body
    elif kind == 3:  # a NaN in the chunk
        t = torch.frombuffer(bytearray(frames[1]), dtype=torch.float32).clone()
        t[rng.randrange(len(t))] = float("nan")
        frames[1] = t.numpy().tobytes()
    else:
        return [mutate_header(rng, frames[0]), *frames[1:]]
    return [msgpack.packb(h), *frames[1:]]


@pytest.mark.timeout(120)
def test_malformed_chunks_are_refused_and_change_nothing():
    h = Harness()
    try:
        # A whole re-sent push in 4 chunks: no reply until its last, which is answered as a duplicate.
        for i in range(4):
            h.client.send(0, chunk_frames(4, i, MsgType.PUSH, seq=5))
            before = h.sent
            h.svc.handle(*h.server.recv(5.0))
            assert h.sent == before + (i == 3)
        reply = decode(h.client.recv(5.0)[1])
        assert reply.type is MsgType.OK and reply.fields.get("duplicate"), reply.fields
        rng = random.Random(18)
        refused = 0
        for _ in range(MESSAGES):
            frames = bad_chunk(rng)
            h.client.send(0, frames)
            item = h.server.recv(5.0)
            assert item is not None, "the shard never received a message"
            before = h.sent
            h.svc.handle(*item)
            replies = h.sent - before
            assert replies == 1 or (replies == 0 and well_formed_nonlast(frames)), f"{replies} replies to {frames[0]!r}"
            if replies:
                got = decode(h.client.recv(5.0)[1])
                if got.type is MsgType.ERROR:
                    refused += 1
                    assert got.fields["code"] != ErrorCode.INTERNAL, got.fields["message"]
            assert h.param_hash() == h.digest, "the parameters changed"
            assert h.svc.shard.version == 1
        assert refused > MESSAGES // 3
        assert h.check(encode(Message(MsgType.STATS, seq=99))).type is MsgType.STATS  # still serving
    finally:
        h.close()


@pytest.mark.timeout(120)
def test_fuzzed_chunks_of_new_pushes_are_each_settled_once():
    """The same fuzz, each message a new push (a fresh seq, so dedup answers none of them from its table):
    every push the shard opened is settled once, `pushes == pushes_applied + dropped`, its version counts
    the steps it took (`updates_applied + partially_applied`), and its weights stay finite."""
    h = Harness(fresh=True)
    try:
        hello = Message(MsgType.HELLO, worker=0, seq=1, fields=h.hello)
        assert h.exchange(encode(hello)).type is MsgType.WELCOME
        init = Message(MsgType.INIT, worker=0, seq=2, tensor=torch.linspace(-1, 1, SIZE))
        assert h.exchange(encode(init)).type is MsgType.OK
        rng = random.Random(27)
        for k in range(MESSAGES):
            frames = bad_chunk(rng)
            head = msgpack.unpackb(frames[0])
            if isinstance(head, dict) and isinstance(head.get("s"), int):
                head["s"] = 10 + k  # a new push, never a re-send
                frames = [msgpack.packb(head), *frames[1:]]
            h.client.send(0, frames)
            item = h.server.recv(5.0)
            assert item is not None, "the shard never received a message"
            before = h.sent
            h.svc.handle(*item)
            for _ in range(h.sent - before):  # wait for each reply sent: one in flight would be read as the next's
                got = h.client.recv(5.0)
                assert got is not None, "a reply the shard sent never arrived"
                reply = decode(got[1])
                assert reply.type is not MsgType.ERROR or reply.fields["code"] != ErrorCode.INTERNAL, reply.fields
        liar = chunk_frames(2, 1, seq=10 + MESSAGES)  # a whole push whose last chunk has a NaN
        body = torch.frombuffer(bytearray(liar[1]), dtype=torch.float32).clone()
        body[0] = float("nan")
        before = h.sent
        for frames in (chunk_frames(2, 0, seq=10 + MESSAGES), [liar[0], body.numpy().tobytes()]):
            h.client.send(0, frames)
            h.svc.handle(*h.server.recv(5.0))
        assert h.sent == before + 1, "a whole push of two chunks is answered once"
        reply = decode(h.client.recv(5.0)[1])
        assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.NONFINITE, reply.fields
        s = h.svc.summary()
        assert s["pushes"] == s["pushes_applied"] + sum(s["dropped"].values()), s
        assert s["version"] == s["updates_applied"] + s["partially_applied"], s
        assert s["dropped"]["invalid"] == 1 and s["dropped"]["partial"] > 0 and s["partially_applied"] > 1, s
        assert bool(torch.isfinite(h.svc.shard.weights).all()), "a non-finite chunk reached the weights"
    finally:
        h.close()
