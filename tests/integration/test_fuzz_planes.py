"""Fuzzing a live shard's payload-plane messages (psrv/transport/plane.py) with the bulk plane on, and
the shared-memory plane's descriptors.

OFFER, PAYLOAD and RESET frames, well-formed and not, marks where no mark belongs, descriptors of
every length and value, and garbage on the bulk plane's TCP port: each message gets exactly one reply
(an OFFER's answer, a RESET, or the service's answer to a non-plane message that is never an INTERNAL
error), the shard keeps serving, and its parameters never change (tests/integration/test_fuzz.py's
Harness: its one worker pushed with the top seq, so no push is new).
"""
from __future__ import annotations

import random
import socket
import struct

import msgpack
import pytest
import zmq

from psrv.protocol import ErrorCode, Message, MsgType, decode, encode
from psrv.transport.bulk_link import READY, TOKEN_BYTES
from psrv.transport.plane import OFFER, PAYLOAD, RESET
from psrv.transport.shm import ShmClientPlane
from tests.integration.test_fuzz import INTS, ODD, SIZE, Harness, templates

MESSAGES = 5000


class PlaneFuzz:
    """The Harness's shard, reached from a raw DEALER that sees the plane's own replies."""

    def __init__(self, **planes):
        self.h = Harness(**(planes or {"bulk": True}))
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.h.server.address)
        self.push = templates(self.h)[2]  # a valid PUSH of a re-sent seq: accepted, never applied

    def exchange(self, frames: list[bytes]) -> list[bytes]:
        self.sock.send_multipart(frames)
        item = self.h.server.recv(5.0)  # None: the transport answered a plane message itself
        if item is not None:
            self.h.svc.handle(*item)
        assert self.sock.poll(5000), "no reply"
        reply = self.sock.recv_multipart()
        assert not self.sock.poll(0), "more than one reply"
        assert self.h.param_hash() == self.h.digest and self.h.svc.shard.version == 1, "the parameters changed"
        if reply[0] not in (OFFER, RESET):
            msg = decode(reply)
            assert msg.type is not MsgType.ERROR or msg.fields["code"] != ErrorCode.INTERNAL, msg.fields
        return reply

    def offer_bulk(self) -> dict:
        reply = self.exchange([OFFER, msgpack.packb({"bulk": {}})])
        assert reply[0] == OFFER
        answer = msgpack.unpackb(reply[1])
        assert answer["plane"] == "bulk", answer
        return answer["bulk"]

    def close(self):
        self.sock.close(linger=0)
        self.h.close()


def descriptor(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return rng.randbytes(rng.choice([0, 1, 8, 15, 16, 17, 40]))
    return struct.pack("!QQ", *(rng.choice([v for v in INTS if 0 <= v < 2**64]) for _ in range(2)))


def plane_message(rng: random.Random, push: list[bytes]) -> list[bytes]:
    kind = rng.randrange(6)
    if kind == 0:  # an OFFER of anything
        body = rng.choice([rng.randbytes(rng.randrange(40)), msgpack.packb(rng.choice(ODD + INTS)),
                           msgpack.packb({"bulk": rng.choice(ODD + INTS), "shm": rng.choice(ODD)}),
                           msgpack.packb({"bulk": {"declined": rng.choice(ODD)}})])
        return [OFFER, body] + [rng.randbytes(4)] * rng.choice([0, 0, 1])
    if kind == 1:  # a PAYLOAD with no plane behind it, or a broken one
        frames = [PAYLOAD, rng.choice([push[0], rng.randbytes(20)]), descriptor(rng)]
        return frames[:rng.choice([1, 2, 3, 3, 3])] + [b"x"] * rng.choice([0, 0, 1])
    if kind == 2:  # a RESET sent to the shard
        return [RESET] + [rng.randbytes(8)] * rng.randrange(3)
    if kind == 3:  # a mark where the header belongs in a normal message, or after it
        return rng.choice([[push[0], PAYLOAD], [push[0], OFFER, b"\x80"], [push[0], RESET]])
    if kind == 4:  # almost a mark
        mark = bytearray(rng.choice([OFFER, PAYLOAD, RESET]))
        mark[rng.randrange(len(mark))] ^= 1 << rng.randrange(8)
        return [bytes(mark), push[0]]
    return [rng.choice([OFFER, PAYLOAD, RESET]) + rng.randbytes(rng.randint(1, 4)), push[1]]


@pytest.fixture
def fuzz():
    f = PlaneFuzz()
    yield f
    f.close()


@pytest.mark.timeout(90)
def test_fuzzed_plane_messages_are_answered_and_change_nothing(fuzz):
    rng = random.Random(18)
    for i in range(MESSAGES):
        frames = plane_message(rng, fuzz.push)
        try:
            fuzz.exchange(frames)
        except AssertionError as exc:
            raise AssertionError(f"message {i}: {exc}; frames={frames!r}") from None
    still_serving(fuzz)


@pytest.mark.timeout(90)
def test_garbage_on_the_bulk_port_and_lying_descriptors(fuzz):
    rng = random.Random(3)
    answer = fuzz.offer_bulk()
    for junk in (b"", rng.randbytes(5), rng.randbytes(TOKEN_BYTES), rng.randbytes(TOKEN_BYTES * 4)):
        with socket.create_connection(("127.0.0.1", answer["port"]), timeout=5) as s:
            s.sendall(junk)
            if len(junk) >= TOKEN_BYTES:  # a token nobody was given: closed unanswered
                assert closed(s)
    with socket.create_connection(("127.0.0.1", answer["port"]), timeout=5) as s:
        s.sendall(answer["token"])
        assert s.recv(1) == READY
        # out of order, too big, malformed: each answered RESET, the connection dropped, nothing allocated
        for bad in (struct.pack("!QQ", 5, 4 * SIZE), struct.pack("!QQ", 0, 2**63), b"\x00" * 3):
            assert fuzz.exchange([PAYLOAD, fuzz.push[0], bad]) == [RESET]
            answer = fuzz.offer_bulk()
            s.close()
            s = socket.create_connection(("127.0.0.1", answer["port"]), timeout=5)
            s.sendall(answer["token"])
            assert s.recv(1) == READY
        # a well-formed payload over the connection: the push arrives whole (a re-sent seq: not applied)
        s.sendall(fuzz.push[1])
        reply = fuzz.exchange([PAYLOAD, fuzz.push[0], struct.pack("!QQ", 0, len(fuzz.push[1]))])
        msg = decode(reply)
        assert msg.type is MsgType.OK and msg.fields.get("duplicate"), msg.fields
        s.close()
    still_serving(fuzz)


def closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:  # (closed with our extra bytes unread)
        return True


def still_serving(fuzz: PlaneFuzz) -> None:
    stats = decode(fuzz.exchange(encode(Message(MsgType.STATS, seq=1))))
    assert stats.type is MsgType.STATS and stats.fields["version"] == 1
    pulled = decode(fuzz.exchange(encode(Message(MsgType.PULL, worker=0, seq=2**64 - 1))))
    assert pulled.type is MsgType.WEIGHTS


@pytest.mark.timeout(90)
def test_lying_shared_memory_descriptors():
    """Once the shard took this process's shared-memory offer, PAYLOADs whose descriptors name other
    processes, fds that are not psrv memfds (stdin, a socket, nothing), wrong sizes and offsets past the
    end: each answered RESET, or where it names a real payload, answered as that push (a re-sent seq,
    never applied); then a true one carries the push."""
    fuzz = PlaneFuzz(shared_memory=True)
    mine = ShmClientPlane()
    try:
        reply = fuzz.exchange([OFFER, msgpack.packb({"shm": mine.offer(0)})])
        assert reply[0] == OFFER and msgpack.unpackb(reply[1])["plane"] == "shm", reply
        true = msgpack.unpackb(mine.put(0, memoryview(fuzz.push[1])))  # the push in a psrv memfd of ours
        rng, answered = random.Random(7), 0
        for i in range(3000):
            d = dict(true)  # the true descriptor with none, one or two of its fields lying
            for k in rng.sample([*true, "off"], rng.choice([0, 1, 1, 2])):
                if k in d and rng.random() < 0.2:
                    del d[k]
                else:
                    d[k] = rng.choice([d.get(k, 0) + rng.choice([-1, 1, 4096]), rng.randrange(64), *INTS, *ODD])
            body = msgpack.packb(d) if rng.random() < 0.9 else rng.randbytes(rng.randrange(30))
            try:
                reply = fuzz.exchange([PAYLOAD, fuzz.push[0], body])
            except AssertionError as exc:
                raise AssertionError(f"descriptor {i}: {exc}; {d!r}") from None
            answered += reply[0] != RESET
        assert 0 < answered < 3000, answered  # the true ones, and lies that change nothing the shard reads
        msg = decode(fuzz.exchange([PAYLOAD, fuzz.push[0], msgpack.packb(true)]))
        assert msg.type is MsgType.OK and msg.fields.get("duplicate"), msg.fields
        still_serving(fuzz)
    finally:
        mine.close()
        fuzz.close()
