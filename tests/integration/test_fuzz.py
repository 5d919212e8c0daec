"""Fuzzing a live shard: >= 10,000 seeded messages over real ZeroMQ on 127.0.0.1.

Random frames, mutated valid messages, truncated and oversized ones, wrong dtypes, shapes and
protocol versions, NaN payloads, and compressed pushes (psrv/codecs: top-k, sign, int8) whose codec,
size, parts, indices or dense ranges are wrong. Each gets exactly one well-formed reply that is never an
INTERNAL error (or, when over --max-message-bytes, is dropped unread), the shard keeps serving
and its parameters never change. The shard's one worker pushed once with the largest seq msgpack
can carry, so no fuzzed push is a *new* update: any change of the parameters would be a bug.
Inputs that once found a bug live in tests/corpus/ and are replayed first.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import random
import time
from pathlib import Path

import msgpack
import pytest
import torch

from psrv.codecs import make
from psrv.codecs.push import PushEncoder
from psrv.config import OptimConfig, ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import PROTOCOL_VERSION, ErrorCode, Message, MsgType, decode, encode
from psrv.server.service import ShardService
from psrv.transport import create_client, create_server

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
SIZE = 1000
MAX_BYTES = 256 * 1024
TOP_SEQ = 2**64 - 1
MESSAGES = 10_000
INTS = [0, 1, -1, 2, 7, 255, 256, -129, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, -2**63, 2**64 - 1]
ODD = [None, True, False, 0.5, float("nan"), float("inf"), "", "x" * 40, b"\x00\xff", [], [1, 2], {}, {"a": 1},
       {"f": {"g": [None]}}, "float32", "bfloat16", "float64", "int8"]


class Harness:
    """A shard served by hand in this thread: send frames, handle them, read the reply."""

    def __init__(self, *, fresh: bool = False, **planes):
        self._level = logging.getLogger("psrv").level  # put back by close(): later tests read psrv's warnings
        logging.getLogger("psrv").setLevel(logging.CRITICAL)  # 10k refusals would flood the log
        cfg = ServerConfig(workers=1, mode="async", worker_timeout=1e6, max_message_bytes=MAX_BYTES,
                           optimizer=OptimConfig(name="sgd", lr=0.1, momentum=0.9))
        self.server = create_server("zmq", "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES, **planes)
        self.svc = ShardService(cfg, self.server, join_timeout=1e6)
        self.client = create_client("zmq", [self.server.address])
        self.sent = 0
        inner = self.server.send

        def counting_send(peer, frames):
            self.sent += 1
            inner(peer, frames)
        self.server.send = counting_send
        self.hello = {"plan_hash": "fuzz", "total": SIZE, "num_shards": 1, "shard": 0, "world_size": 1}
        self.digest = None
        if fresh:
            return
        for msg in (Message(MsgType.HELLO, worker=0, seq=1, fields=self.hello),
                    Message(MsgType.INIT, worker=0, seq=2, tensor=torch.linspace(-1, 1, SIZE)),
                    Message(MsgType.PUSH, worker=0, seq=TOP_SEQ, tensor=torch.full((SIZE,), 0.5))):
            reply = self.exchange(encode(msg))
            assert reply.type in (MsgType.WELCOME, MsgType.OK), reply.fields
        assert self.svc.shard.version == 1
        self.digest = self.param_hash()

    def param_hash(self) -> str | None:
        if self.svc.shard is None or self.svc.shard.size * 4 > MAX_BYTES:
            return None  # (a shard no message could fill must never be allocated)
        return hashlib.sha256(self.svc.shard.weights.numpy().tobytes()).hexdigest()

    def exchange(self, frames: list) -> Message | None:
        """None when the frames were over the size bound (dropped with the connection)."""
        self.client.send(0, frames)
        oversized = max(len(memoryview(f).cast("B")) for f in frames) > MAX_BYTES
        item = self.server.recv(0.05 if oversized else 5.0)
        if oversized:
            assert item is None, "an oversized frame got through"
            self.client.reconnect(0)
            return None
        assert item is not None, "the shard never received a message"
        before = self.sent
        self.svc.handle(*item)
        assert self.sent == before + 1, f"{self.sent - before} replies to one request"
        got = self.client.recv(5.0)
        assert got is not None, "no reply"
        return decode(got[1])

    def check(self, frames: list) -> Message | None:
        reply = self.exchange(frames)
        if reply is not None and reply.type is MsgType.ERROR:
            assert reply.fields["code"] != ErrorCode.INTERNAL, reply.fields["message"]
        if self.digest is not None:
            assert self.param_hash() == self.digest, "the parameters changed"
            assert self.svc.shard.version == 1
        else:
            assert self.svc.shard is None or self.svc.shard.size * 4 <= MAX_BYTES
        return reply

    def close(self):
        self.client.close()
        self.server.close()
        logging.getLogger("psrv").setLevel(self._level)


# --- the generator ---------------------------------------------------------------------
def templates(h: Harness) -> list[list[bytes]]:
    t = torch.full((SIZE,), 0.25)
    msgs = [Message(MsgType.HELLO, worker=0, seq=5, fields=h.hello),
            Message(MsgType.INIT, worker=0, seq=5, tensor=t),
            Message(MsgType.PUSH, worker=0, seq=5, clock=3, base_version=1, tensor=t),
            Message(MsgType.PUSH_PULL, worker=0, seq=6, clock=3, base_version=1, tensor=t.to(torch.bfloat16)),
            Message(MsgType.PULL, worker=0, seq=7, clock=2, fields={"final": True}),
            Message(MsgType.HEARTBEAT, worker=0, seq=8, fields={"probe": 8}),
            Message(MsgType.LEAVE, worker=0, seq=9), Message(MsgType.STATS, seq=10),
            Message(MsgType.CHECKPOINT, seq=11), Message(MsgType.SHUTDOWN, seq=12)]
    return [[bytes(memoryview(f).cast("B")) for f in encode(m)] for m in msgs + compressed()]


def compressed() -> list[Message]:
    """Valid compressed pushes of this shard: top-k with a dense range (a 100-element tensor under
    compress_min_numel), sign and int8 (the seq is below the top one: accepted as re-sent, not applied)."""
    plan = PartitionPlan((ParamSpec("w", (SIZE - 100,)), ParamSpec("b", (100,))), 1)
    grad = torch.linspace(-2, 3, SIZE)
    out = []
    for spec, mtype in (("topk:0.05", MsgType.PUSH), ("sign", MsgType.PUSH_PULL), ("int8", MsgType.PUSH)):
        fields, parts = PushEncoder(make(spec), plan, min_numel=101).encode(grad, 0)
        out.append(Message(mtype, worker=0, seq=13, clock=3, base_version=1, fields=fields, parts=parts))
    return out


def bad_compressed(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """A compressed push with one thing wrong: the codec's name or size, a parameter, a part's
    dtype, length or presence, an index out of range, a dense range, a NaN value."""
    h = msgpack.unpackb(frames[0])
    body = list(frames[1:])
    codec, spec = h["f"]["codec"], h["p"]
    kind = rng.randrange(8)
    if kind == 0:
        codec["name"] = rng.choice(["lz4", "TOPK", "", 3, None])
    elif kind == 1:
        codec["n"] = rng.choice([SIZE - 1, SIZE + 1, 0, -1, 2**40, "1000", None])
    elif kind == 2:
        codec[rng.choice(["chunk", "ratio", "dense"])] = odd_value(rng)
    elif kind == 3:  # a part's dtype
        spec[rng.randrange(len(spec))][1] = rng.choice(["int32", "int8", "uint8", "float16", "float64", 7])
    elif kind == 4:  # a part shortened, its length in the header agreeing or not
        i = rng.randrange(len(body))
        body[i] = body[i][:rng.randrange(len(body[i]) + 1)]
        if rng.random() < 0.7:
            spec[i][2] = len(body[i])
    elif kind == 5:  # a part dropped
        i = rng.randrange(len(body))
        del body[i]
        if rng.random() < 0.7:
            del spec[i]
    elif kind == 6 and spec[0][0] == "indices":  # an index out of range
        idx = torch.frombuffer(bytearray(body[0]), dtype=torch.int32).clone()
        idx[rng.randrange(len(idx))] = rng.choice([SIZE, SIZE + 7, -1, 2**31 - 1, -2**31])
        body[0] = idx.numpy().tobytes()
    else:  # a NaN among the floats
        i = next((k for k, e in enumerate(spec) if e[1] == "float32"), 0)
        vals = torch.frombuffer(bytearray(body[i]), dtype=torch.uint8).clone()
        if len(vals) >= 4:
            vals[:4] = torch.tensor([0, 0, 192, 127], dtype=torch.uint8)  # float32 NaN
        body[i] = vals.numpy().tobytes()
    return [msgpack.packb(h), *body]


def odd_value(rng: random.Random):
    return rng.choice(INTS) if rng.random() < 0.5 else rng.choice(ODD)


def mutate_header(rng: random.Random, head: bytes) -> bytes:
    try:
        h = msgpack.unpackb(head)
    except Exception:  # an earlier mutation broke it already
        return mutate_bytes(rng, head)
    if not isinstance(h, dict):
        return mutate_bytes(rng, head)
    key = rng.choice(["t", "v", "w", "s", "c", "bv", "f", "dt", "n", "zz"])
    if key == "f" and isinstance(h.get("f"), dict) and rng.random() < 0.7:
        h["f"][rng.choice(list(h["f"]) + ["final", "probe", "plan_hash", "total", "shard"])] = odd_value(rng)
    elif key == "t" and rng.random() < 0.5:
        h["t"] = rng.choice(list(MsgType)).value
    elif rng.random() < 0.15:
        h.pop(key, None)
    else:
        h[key] = odd_value(rng)
    if key == "s" and isinstance(h.get("s"), int) and h["s"] > TOP_SEQ:
        h["s"] = TOP_SEQ
    return msgpack.packb(h)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    op = rng.randrange(5)
    if op == 0 and b:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif op == 1:
        del b[rng.randrange(len(b) + 1):]
    elif op == 2:
        b[rng.randrange(len(b) + 1):rng.randrange(len(b) + 1)] = rng.randbytes(rng.randint(1, 16))
    elif op == 3 and b:
        del b[rng.randrange(len(b))]
    else:
        b += rng.randbytes(rng.randint(1, 64))
    return bytes(b)


def bad_tensor(rng: random.Random, head: bytes) -> list[bytes]:
    """Right header, wrong payload: NaN/Inf, wrong dtype or shape (consistent or not)."""
    h = msgpack.unpackb(head)
    h["t"] = rng.choice([MsgType.PUSH, MsgType.PUSH_PULL, MsgType.INIT]).value
    kind = rng.randrange(4)
    if kind == 0:
        t = torch.full((SIZE,), 0.1)
        t[rng.randrange(SIZE)] = rng.choice([float("nan"), float("inf"), -float("inf")])
        body = t.numpy().tobytes()
    elif kind == 1:
        import numpy as np
        dt = rng.choice(["float64", "int8", "int32", "uint8"])
        body = np.ones(SIZE, dtype=dt).tobytes()
        h["dt"] = rng.choice([dt, "float32"])
    elif kind == 2:
        body = torch.ones(rng.choice([0, 1, SIZE - 1, SIZE + 1, 2 * SIZE])).numpy().tobytes()
    else:
        body = torch.ones(SIZE, dtype=torch.float16).numpy().tobytes()[:rng.randrange(2 * SIZE)]
        h["dt"] = "float16"
    h.setdefault("dt", "float32")
    h["n"] = len(body) if rng.random() < 0.8 else odd_value(rng)
    return [msgpack.packb(h), body]


def generate(rng: random.Random, tpl: list[list[bytes]]) -> tuple[str, list[bytes]]:
    r = rng.random()
    if r < 0.01:
        return "oversized", [rng.randbytes(16) * (MAX_BYTES // 16 + rng.randint(1, 64))]
    if r < 0.15:
        return "random frames", [rng.randbytes(rng.choice([0, 1, 5, 40, 300, 70_000] if rng.random() < 0.1
                                                         else [0, 1, 5, 40, 300])) for _ in range(rng.randint(1, 3))]
    frames = list(rng.choice(tpl))
    if r < 0.25 and len(frames) > 2:
        return "bad compressed", bad_compressed(rng, frames)
    if r < 0.35:
        return "bad tensor", bad_tensor(rng, frames[0])
    if r < 0.45:
        h = msgpack.unpackb(frames[0])
        h["v"] = rng.choice([0, PROTOCOL_VERSION + 1, str(PROTOCOL_VERSION), None, 1.0])
        return "wrong version", [msgpack.packb(h), *frames[1:]]
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(6)
        if op in (0, 1):
            frames[0] = mutate_header(rng, frames[0])
        elif op == 2:
            frames[0] = mutate_bytes(rng, frames[0])
        elif op == 3 and len(frames) > 1:
            frames[1] = mutate_bytes(rng, frames[1])
        elif op == 4:
            frames = frames[:1] if len(frames) > 1 else frames + [rng.randbytes(rng.randrange(8) * 4)]
        else:
            frames = frames + [frames[-1]]
    return "mutated", frames


# --- the tests ---------------------------------------------------------------------
def corpus_cases() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(CORPUS.glob("*.json"))]


def current_version(frames: list[bytes]) -> list[bytes]:
    """A corpus input with today's protocol version in its header (what it found is in the rest of it)."""
    head = msgpack.unpackb(frames[0], strict_map_key=False)
    if isinstance(head, dict) and isinstance(head.get("v"), int):
        head["v"] = PROTOCOL_VERSION
    return [msgpack.packb(head), *frames[1:]]


@pytest.fixture
def harness():
    h = Harness()
    yield h
    h.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", corpus_cases(), ids=lambda c: c["name"])
def test_corpus_case_is_answered_and_changes_nothing(case):
    h = Harness(fresh=case.get("fresh", False))
    try:
        reply = h.check(current_version([base64.b64decode(f) for f in case["frames_b64"]]))
    finally:
        h.close()
    if "expect_code" in case:
        assert reply is not None and reply.fields.get("code") == ErrorCode[case["expect_code"]]


@pytest.mark.timeout(120)
def test_ten_thousand_fuzzed_messages(harness):
    rng = random.Random(20240611)
    tpl = templates(harness)
    for frames in tpl[-3:]:  # the compressed templates are well-formed: accepted (as re-sent), not refused
        reply = harness.check(frames)
        push = reply.fields.get("push", reply.fields)
        assert reply.type in (MsgType.OK, MsgType.WEIGHTS) and push.get("duplicate"), reply.fields
    kinds: dict[str, int] = {}
    started = time.monotonic()
    for i in range(MESSAGES):
        kind, frames = generate(rng, tpl)
        kinds[kind] = kinds.get(kind, 0) + 1
        try:
            harness.check(frames)
        except AssertionError as exc:  # name the input so it can join tests/corpus
            b64 = [base64.b64encode(f).decode() for f in frames]
            raise AssertionError(f"message {i} ({kind}) {exc}; frames_b64={json.dumps(b64)}") from None
    # still serving: a clean STATS and a clean PULL (weights unchanged) after all that
    stats = harness.check(encode(Message(MsgType.STATS, seq=1)))
    assert stats.type is MsgType.STATS and stats.fields["version"] == 1
    harness.check(encode(Message(MsgType.HELLO, worker=0, seq=TOP_SEQ, fields=harness.hello)))
    pulled = harness.check(encode(Message(MsgType.PULL, worker=0, seq=TOP_SEQ)))
    assert pulled.type is MsgType.WEIGHTS and torch.equal(pulled.tensor, harness.svc.shard.weights)
    print(f"\nfuzz: {MESSAGES} messages in {time.monotonic() - started:.1f}s: {kinds}; "
          f"errors answered {harness.svc.state.stats.errors}")


@pytest.mark.timeout(60)
def test_fuzzed_first_messages_to_a_fresh_shard():
    """Before any HELLO: mutated HELLO/INIT/PUSH first contacts never crash it or make it allocate
    a shard no message could fill (a HELLO's `total` is the peer's to choose)."""
    h = Harness(fresh=True)
    try:
        rng = random.Random(7)
        tpl = templates(h)[:3]
        for _ in range(2000):
            kind, frames = generate(rng, tpl)
            h.check(frames)
            if h.svc.shard is not None:  # a mutated HELLO got in: start over with a fresh shard
                h.close()
                h = Harness(fresh=True)
    finally:
        h.close()
