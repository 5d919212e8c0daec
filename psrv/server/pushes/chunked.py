"""Chunked pushes: a dense push split by the client into chunks that the shard applies as they arrive.

A chunk is a PUSH, PUSH_PULL or INIT whose fields carry `chunk: [i, n]`: the i-th of n chunks of one
push (one seq), holding the elements [lo, hi) of `chunk_range(size, n, i)`. The push's bookkeeping
is done once, at the first chunk that arrives (dedup, the controller's decision, the staleness);
every chunk is then stepped on its own elements (psrv/server/shard.py apply_slice: torch.optim's
math on views); the push counts as one update once all n are in, and is answered once, when its
last chunk (i = n-1) finds every chunk applied. A re-sent push re-sends every chunk: those already
applied are skipped, so each is applied exactly once; a lost chunk leaves the push unanswered, and
the client's probe then re-sends it. Pulls are held while a push is half applied, so no pull reads
one, and so are the other workers' pushes (psrv/server/pushes/queued.py): pushes are applied one at a time, in
the order of their first message, each at its own step count and lr, bit for bit the whole pushes in
that order. INIT goes in chunks alike (copied into the weights). The receive memory is one chunk, not
one shard. The shard's summary counts the pushes that came in chunks (`chunked_pushes`, at their first).

A push is applied whole or not at all: psrv's client never chunks a non-finite gradient (it sends it
whole, for the shard's --nonfinite policy). A peer that does anyway is refused from that chunk on; what
its earlier chunks applied cannot be undone without a copy of the shard, which chunks exist to avoid,
so the push is refused (ERROR, under either policy), counted once in dropped "invalid", and its step
counted in `partially_applied`; the shard logs it. A worker that leaves half-way is counted the same way
(dropped "partial").

Where a push needs all of itself (sync's accumulation, DC-ASGD's and delayed Nesterov's rules,
onebit_adam) the shard says so in WELCOME (`chunks: false`) and the client sends pushes whole.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from psrv.chunking import chunk_range
from psrv.config import ServerConfig
from psrv.protocol import ErrorCode, Message, ProtocolError
from psrv.server import validate
from psrv.server.dedup import refused_again
from psrv.server.consistency import Decision
from psrv.server.rules import PushContext

log = logging.getLogger("psrv.server")
CHUNK_MODES = ("async", "ssp")
CHUNK_RULES = ("plain", "staleness-lr", "cgad")  # element by element, from the push's context alone
CHUNK_OPTIMIZERS = ("sgd", "adam", "adamw")


def takes_chunks(cfg: ServerConfig) -> bool:
    """Whether this shard applies pushes chunk by chunk (WELCOME's `chunks`)."""
    o = cfg.optimizer
    return cfg.mode in CHUNK_MODES and o.update_rule in CHUNK_RULES and o.name in CHUNK_OPTIMIZERS


def parse_chunk(msg: Message, size: int) -> tuple[int, int, int, int]:
    """(i, n, lo, hi) of a chunk message, its tensor checked against the range; MALFORMED/BAD_TENSOR else."""
    spec = msg.fields.get("chunk")
    if (not isinstance(spec, (list, tuple)) or len(spec) != 2 or not all(type(v) is int for v in spec)
            or not 2 <= spec[1] <= size or not 0 <= spec[0] < spec[1]):
        raise ProtocolError(ErrorCode.MALFORMED, f"chunk must be [i, n] with 0 <= i < n and 2 <= n <= {size}; "
                            f"got {spec!r}")
    if msg.parts is not None or "codec" in msg.fields:
        raise ProtocolError(ErrorCode.MALFORMED, "a compressed push is not chunked")
    i, n = spec
    lo, hi = chunk_range(size, n, i)
    if hi <= lo:
        raise ProtocolError(ErrorCode.MALFORMED, f"chunk {i} of {n} over {size} elements is empty")
    validate.tensor(msg, hi - lo)
    return i, n, lo, hi


@dataclass
class OpenPush:
    """A push whose chunks are arriving: what its first chunk decided, and which chunks are in."""

    seq: int
    chunks: int
    decision: Decision
    ctx: PushContext
    info: dict
    done: set[int] = field(default_factory=set)
    applied: int = 0           # chunks stepped (not skipped as late or nonfinite)
    scale: float = 1.0
    refused: str = ""          # a nonfinite chunk under --nonfinite reject: the push's answer is ERROR
    started: float = field(default_factory=time.perf_counter)


class ChunkedPushes:
    """The open chunked push of each worker (at most one: a worker waits for a push's answer), kept for
    `pushes` (psrv/server/pushes/handler.py), whose answers and late streaks it shares; `s`: the shard's state."""

    def __init__(self, pushes):
        self.p = pushes
        self.s = pushes.state
        self.open: dict[int, OpenPush] = {}
        self.init: tuple[tuple[int, int, int], set[int], list[int]] | None = None  # INIT's chunks: (worker, seq, n)

    @property
    def applying(self) -> bool:
        """A push is half applied: pulls wait."""
        return any(p.applied for p in self.open.values())

    def blocks(self, worker: int) -> bool:
        """Must a push of `worker` wait now (another worker's push is open)?"""
        return bool(self.open) and worker not in self.open

    def take(self, msg: Message) -> dict | None:
        """Handle one chunk; the push's answer when it is whole and this is its last chunk, else None."""
        s = self.s
        shard = s.ready_shard(msg, need_init=True)
        if not takes_chunks(s.cfg):
            raise ProtocolError(ErrorCode.NOT_ALLOWED, "this shard takes pushes whole (WELCOME chunks: false)")
        i, n, lo, hi = parse_chunk(msg, shard.size)
        validate.push_kind(msg, s.cfg.optimizer)
        replayed = s.dedup.replay(msg.worker, msg.seq, shard.version)
        if replayed is not None:  # the whole push was answered before: its last chunk answers again
            if i == n - 1:
                s.stats.duplicate()
                return refused_again(replayed)
            return None
        push = self.open.get(msg.worker)
        if push is None or push.seq != msg.seq:
            if push is not None:  # a newer seq: the client gave that one up (it restarted)
                self.forget(msg.worker)
            push = self.open[msg.worker] = self._begin(msg, n)
            s.stats.chunked()
        elif push.chunks != n:
            raise ProtocolError(ErrorCode.MALFORMED, f"chunk {i} says {n} chunks; this push has {push.chunks}")
        if i not in push.done:
            push.done.add(i)
            self._step(push, msg.tensor, lo, hi, i)
        if i != n - 1 or len(push.done) < n:
            return None
        del self.open[msg.worker]
        return self._end(msg, push)

    def take_init(self, msg: Message) -> dict | None:
        """One chunk of INIT: its values copied into the shard's weights, which count as initialised (and
        are answered {"already": False}) once every chunk is in, at the last; NONFINITE there if one had
        NaN or Inf (the shard then stays uninitialised). An initialised shard keeps its weights."""
        shard = self.s.ready_shard(msg, need_init=False)
        if not takes_chunks(self.s.cfg):
            raise ProtocolError(ErrorCode.NOT_ALLOWED, "this shard takes INIT whole (WELCOME chunks: false)")
        i, n, lo, hi = parse_chunk(msg, shard.size)
        if shard.initialised:
            return {"already": True} if i == n - 1 else None
        key = (msg.worker, msg.seq, n)
        if self.init is None or self.init[0] != key:
            self.init = (key, set(), [])
        _, done, refused = self.init
        if i not in done:
            done.add(i)
            if validate.is_finite(msg.tensor):
                shard.param.data[lo:hi].copy_(msg.tensor)  # unread: pulls wait for an initialised shard
            else:
                refused.append(i)
        if i != n - 1 or len(done) < n:
            return None
        self.init = None
        if refused:
            raise ProtocolError(ErrorCode.NONFINITE, f"initial weights have NaN or Inf (chunks {refused}); refused")
        shard.initialised = True
        return {"already": False}

    def forget(self, worker: int) -> None:
        """`worker` left, restarted or gave the push up: the push is dropped ("partial"), counted once;
        its chunks applied so far stay, as one step of the shard (`partially_applied`)."""
        push = self.open.pop(worker, None)
        if push is None:
            return
        stats = self.s.stats
        stats.pushed(time.perf_counter() - push.started, None)
        stats.drop("partial")
        self.s.history.record("drop", w=worker, seq=push.seq, clock=push.ctx.clock, epoch=self.p.epoch,
                              why="partial", applied_chunks=push.applied)
        if push.applied:
            self.s.shard.end_slices()
            stats.partial()

    def _begin(self, msg: Message, n: int) -> OpenPush:
        s, shard = self.s, self.s.shard
        pushed = s.controller.clocks.get(msg.worker, 0)
        decision = s.controller.push(msg.worker, msg.clock)
        staleness = max(0, shard.version - msg.base_version)
        info = {"version": shard.version, "staleness": staleness}
        if decision is Decision.DROP:
            s.stats.drop("late")
            info = {**info, "dropped": "late", "staleness": 0, **self.p.late.dropped(
                msg.worker, clock=msg.clock, pushed=pushed, open_clock=s.controller.next_clock(msg.worker))}
        else:
            self.p.late.applied(msg.worker)
        return OpenPush(msg.seq, n, decision, PushContext(msg.worker, msg.clock, msg.base_version, staleness), info)

    def _step(self, push: OpenPush, grad: torch.Tensor, lo: int, hi: int, i: int) -> None:
        if push.decision is not Decision.APPLY or push.refused:
            return
        if not validate.all_finite(grad):
            push.refused = f"chunk {i} has NaN or Inf; refused with the chunks after it"
            return
        self.p.before_write()  # replies still reading the weights must leave before we write them
        push.scale = self.s.shard.apply_slice(grad, lo, hi, push.ctx)
        push.applied += 1

    def _end(self, msg: Message, push: OpenPush) -> dict:
        s, shard = self.s, self.s.shard
        if push.refused:
            return self._refused(msg, push)
        if push.applied:
            shard.end_slices()
            s.stats.applied(shard.version, lr_scale=push.scale)
        s.stats.pushed(time.perf_counter() - push.started, None if "dropped" in push.info else push.info["staleness"])
        s.stats.membership(s.controller.active, {msg.worker: s.controller.clocks[msg.worker]})
        return self.p.record_answer(msg, {**push.info, "version": shard.version})

    def _refused(self, msg: Message, push: OpenPush) -> dict:
        """A push with a non-finite chunk, counted once (dropped "invalid"). With nothing applied it
        follows --nonfinite; with chunks applied it is refused whatever the policy (see the docstring)."""
        s, shard = self.s, self.s.shard
        s.stats.pushed(time.perf_counter() - push.started, None)
        s.stats.drop("invalid")
        if push.applied:
            shard.end_slices()
            s.stats.partial()
            log.warning("shard %d: worker %d sent a chunked push with NaN or Inf after %d of its %d chunks were "
                        "applied; refused, and those chunks stay applied (psrv's client sends such a push whole)",
                        s.cfg.shard, msg.worker, push.applied, push.chunks)
        elif s.cfg.nonfinite == "skip":
            return self.p.record_answer(msg, {**push.info, "version": shard.version, "dropped": "nonfinite",
                                         "staleness": 0})
        refusal = push.refused + (f" ({push.applied} before it were applied)" if push.applied else "") + " (see --nonfinite)"
        self.p.record_answer(msg, {**push.info, "version": shard.version, "refused": refusal})
        raise ProtocolError(ErrorCode.NONFINITE, refusal)
