"""One request to every shard and its replies, through lost messages, lost replies and restarted
shards (PSClient's mechanics; `client` below is the psrv.client.psclient.PSClient that owns it, a module
that imports this one, used through its public face: `net`, `servers`, `timeout_option`, `message`, `addresses`
(psrv/client/shard_addresses.py: `failover`, `moved`, `heard`), `hello_message`, `fill_push`, `receive_weights`); PSError, what an ERROR reply becomes; Reply, what a push or pull saw; and
WireBytes, what the round trips' frames came to (PSClient.wire)."""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import torch

from psrv.chunking import chunk_count, chunk_range
from psrv.codecs.push import finite
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.client.waiting import HelloWait

log = logging.getLogger("psrv.client.psclient")


class PSError(RuntimeError):
    """A shard answered ERROR; `code` is a psrv.protocol.ErrorCode, `fields` the whole reply."""

    def __init__(self, shard: int, code: int, message: str, *, fields: dict | None = None):
        super().__init__(f"shard {shard}: {ErrorCode(code).name}: {message}")
        self.shard, self.code, self.message = shard, ErrorCode(code), message
        self.fields = dict(fields or {})


@dataclass
class Reply:
    """What a push/pull saw: per-shard versions plus the worst staleness, wait and clock gap."""

    versions: list[int]
    clock: int = 0
    staleness: int = 0
    waited: float = 0.0
    gap: int = 0
    fields: list[dict] = field(default_factory=list)
    weights: torch.Tensor | None = None  # where the weights pulled lie: `out`, or (pull_in_place) the shard's memory


@dataclass
class WireBytes:
    """Bytes of the frames this client handed to its transport and got back (headers included,
    re-sends and probes too): `pushed` (PUSH and PUSH_PULL requests), `pulled` (WEIGHTS replies),
    `sent` and `received` (everything), and `dense_pushed`, what the pushes' payloads would have been
    as float32 (4 bytes per element pushed), against which `pushed` gives the compression ratio."""

    pushed: int = 0
    pulled: int = 0
    sent: int = 0
    received: int = 0
    dense_pushed: int = 0

    def to_dict(self) -> dict:
        ratio = self.dense_pushed / self.pushed if self.pushed else None
        return {"bytes_pushed": self.pushed, "bytes_pulled": self.pulled, "bytes_sent": self.sent,
                "bytes_received": self.received, "dense_push_bytes": self.dense_pushed, "compression_ratio": ratio}


def in_chunks(msg: Message, chunk_bytes: int) -> list[Message]:
    """A dense push or INIT as the messages it goes in: itself, or where the shards take chunks (`chunk_bytes`
    > 0: PSClient.push_chunk_bytes, once every shard's WELCOME said `chunks`, and not to a shard that reads the
    tensor where it lies: RoundTrip.send) and its tensor is over chunk_bytes, its chunks
    (psrv/server/pushes/chunked.py), each a view of the tensor."""
    t = msg.tensor
    if not chunk_bytes or t is None or msg.parts is not None or "fragment" in msg.fields:  # a fragment goes whole
        return [msg]
    n = chunk_count(t.numel(), max(1, chunk_bytes // t.element_size()))
    if n == 1 or not finite(t):  # a non-finite push goes whole: the shard refuses or drops all of it
        return [msg]
    return [Message(msg.type, worker=msg.worker, session=msg.session, seq=msg.seq, clock=msg.clock,
                    base_version=msg.base_version, fields={**msg.fields, "chunk": [i, n]},
                    tensor=t[slice(*chunk_range(t.numel(), n, i))]) for i in range(n)]


class RoundTrip:
    """One request to every shard, seen through lost messages, lost replies and restarted shards.

    Every retry_interval (doubling) an unanswered shard gets a small HEARTBEAT probe on the same
    connection: a shard that holds the request (a pull it may not answer yet) says so and we wait;
    one that does not gets the request again, same seq. A probe left unanswered means the
    connection or the shard is gone: reconnect and re-send. Any answer counts as a sign of life.
    `limit` (seconds) bounds the whole wait even while the shards answer probes; past it,
    TimeoutError(`why`). A HELLO left unanswered says so every few seconds (psrv/client/waiting.py).
    """

    MAX_HELLOS = 5
    REFUSED_WAIT = 5.0  # seconds a refused HELLO waits for the other shards' answers before it is raised

    def __init__(self, client: "PSClient", msgs: list[Message], seq: int, timeout: float, *,
                 limit: float | None = None, why: str = ""):
        self.c, self.net, self.seq, self.timeout = client, client.net, seq, timeout
        self.limit, self.why = limit, why
        for m in msgs:
            m.seq = seq
        self.msgs = msgs
        # encoded when sent (the tensor may still be filling): one frame list per message, several for a
        # push sent in chunks (psrv/server/pushes/chunked.py)
        self.frames: list[list[list] | None] = [None] * len(msgs)
        self.kind = msgs[0].type.name
        self.pushing = msgs[0].type in (MsgType.PUSH, MsgType.PUSH_PULL)
        self.chunky = self.pushing or msgs[0].type is MsgType.INIT  # may go in chunks (in_chunks)
        self.payload = self.pushing or msgs[0].type in (MsgType.PULL, MsgType.INIT)  # tensors go or come back
        self.resent = False  # a request went again (lost, or a probe unanswered)
        n = len(msgs)
        self.replies: list[Message | None] = [None] * n
        self.probing = [False] * n     # a probe is out and unanswered
        self.greeting = [False] * n    # re-sent HELLO, waiting for WELCOME
        self.hellos = [0] * n
        # a HELLO refused by one shard: raised once every shard has answered it (at most REFUSED_WAIT s more), so
        # each has heard it and refuses the rank too, where closing at once could drop a HELLO not yet sent
        self.refused: PSError | None = None
        self.refused_by = math.inf  # when a refusal is raised whatever the other shards have said

    def send(self, s: int) -> None:
        """Send shard s its request now (once)."""
        if self.frames[s] is None:
            self.c.in_place.release(s, pushing=self.pushing)  # done with the weights read in place (if held)
            t = self.msgs[s].tensor
            whole = t is not None and self.net.in_place(s, t)  # read where it lies: nothing to bound or pipeline
            pieces = in_chunks(self.msgs[s], self.c.push_chunk_bytes if self.c.chunked and not whole else 0) \
                if self.chunky else [self.msgs[s]]
            self.frames[s] = [encode(m) for m in pieces]
            if self.pushing:
                lo, hi = self.c.ranges[s]
                fragment = self.msgs[s].fields.get("fragment")  # streaming DiLoCo: that fragment's elements only
                self.c.wire.dense_pushed += 4 * (hi - lo if fragment is None else sum(b - a for a, b in fragment))
                self.c.history.record("push", w=self.c.worker, seq=self.seq, shard=s, clock=self.msgs[s].clock,
                                      to=self.c.servers[s])
            self._out(s, self.frames[s], push=self.pushing)

    def _out(self, s: int, messages: list[list], *, push: bool = False) -> None:
        """Send messages (each a list of frames) to shard s, counting their bytes (PSClient.wire)."""
        for frames in messages:
            n = sum(memoryview(f).nbytes for f in frames)
            self.c.wire.sent += n
            if push:
                self.c.wire.pushed += n
            self.net.send(s, frames)

    def run(self) -> list[Message]:
        for s in range(len(self.msgs)):
            self.send(s)
        # The first probe waits at least twice as long as this client's recent round trips took: on a slow
        # link a large request or its answer may still be on the wire, and a probe's answer queues behind
        # it, so a probe left unanswered for retry_interval alone would re-send a request that is not lost.
        recent = 2 * self.c.recent_seconds
        interval = max(self.c.retry_interval, recent)
        now = started = time.monotonic()
        deadline, check_at = now + self.timeout, now + interval
        bound = now + self.limit if self.limit is not None else math.inf
        notice = HelloWait(worker=self.c.worker, servers=self.c.servers, timeout=self.timeout,
                           option=self.c.timeout_option, started=now) if self.kind == "HELLO" else None
        while None in self.replies:
            now = time.monotonic()
            if now >= self.refused_by:
                raise self.refused
            if now >= deadline:  # no sign of life at all: say that, not `why`
                raise TimeoutError(self._silence())
            if now >= bound:
                raise TimeoutError(self.why)
            if notice is not None and now >= notice.due:  # a HELLO unanswered for a while: say what we wait for
                notice.say(now, [s for s, r in enumerate(self.replies) if r is None])
                continue
            if now >= check_at:
                self._probe_missing()
                interval = min(interval * 2, max(8 * self.c.retry_interval, recent))
                check_at = now + interval
                continue
            if self._move_broken():  # its probes start afresh there: the backup takes over within the bound
                interval = max(self.c.retry_interval, recent)
                check_at = now + interval
            if None not in self.replies:  # the last reply was taken before a break was looked at
                break
            got = self.net.recv(min(deadline, check_at, bound, self.refused_by, notice.due if notice else math.inf)
                                - now)
            if got is not None and self._take(*got):
                deadline = time.monotonic() + self.timeout
        if self.refused is not None:
            raise self.refused
        if self.chunky:  # every push or INIT payload of it answered: their transient memory may go
            self.net.idle()
        if self.payload and not self.resent:  # a decaying maximum: it follows a slower link at once and a
            # faster one gradually; a round trip that re-sent is left out, or each loss would lengthen the next wait.
            # The time a shard held the request on purpose (`waited`: a sync barrier, the SSP bound) is not the
            # link's: counted in, one slow clock made every later lost request wait seconds before its probe.
            held = max((r.fields.get("waited", 0.0) for r in self.replies), default=0.0)
            self.c.recent_seconds = max(0.8 * self.c.recent_seconds, time.monotonic() - started - held)
        return self.replies

    def _silence(self) -> str:
        """What a timeout says: which shard at which address, what to check, and the option that sets the
        bound (the client's `timeout_option`: the keyword or flag of the API in use). Past HELLO the shard
        had answered, so silence there is a dead shard or a network cut between (a partition), not one
        never started."""
        missing = [s for s, r in enumerate(self.replies) if r is None]
        where = ", ".join(f"{self.c.servers[s]} (shard {s})" for s in missing)
        check = "is `psrv serve` running there?" if self.kind == "HELLO" else \
            "the shard stopped answering: is it still running, and is the network to it up?"
        return (f"worker {self.c.worker}: no reply from {where} within {self.timeout:g}s to {self.kind}; "
                f"{check} {self.c.timeout_option} sets the bound")

    def _move_broken(self) -> bool:
        """Move each unanswered shard whose connection broke (its process ended: the transport says so at once,
        psrv/transport/base.py `down`) to its next replica now, not once a probe went unanswered, and re-send
        there, same seq; True if one moved. Its backup holds the request until it takes over, then answers."""
        if not any(r is None and self.net.down(s) for s, r in enumerate(self.replies)):
            return False
        # what came before the break is taken first: a shard that answered, then ended (the last LEAVE's OK), broke
        # in the same poll that brought another shard's reply, and its own was still queued
        while (got := self.net.recv(0)) is not None:
            self._take(*got)
        moved = False
        for s, r in enumerate(self.replies):
            if r is None and self.net.down(s) and self.c.addresses.failover(s, why="connection broke"):
                self.probing[s] = False
                self._resend(s)
                moved = True
        return moved

    def _probe_missing(self) -> None:
        for s, r in enumerate(self.replies):
            if r is not None:
                continue
            if self.probing[s]:  # no answer to the last probe either: a fresh connection, to its next replica if any
                log.info("worker %d: shard %d silent; reconnecting and re-sending %s seq %d",
                         self.c.worker, s, self.kind, self.seq)
                if not self.c.addresses.failover(s):
                    self.net.reconnect(s)
                self._resend(s)
            probe = self.c.message(MsgType.HEARTBEAT, seq=self.seq, fields={"probe": self.seq})
            self._out(s, [encode(probe)])
            self.probing[s] = True

    def _resend(self, s: int) -> None:
        self.resent = True
        if self.greeting[s]:
            self._out(s, [encode(self._hello(s))])
        else:
            self._out(s, self.frames[s], push=self.pushing)

    def _hello(self, s: int) -> Message:
        """HELLO said again inside this round trip: it carries the round trip's seq, so its WELCOME is taken
        as this round trip's reply (one with seq 0 was dropped as stale, and the round trip never ended)."""
        hello = self.c.hello_message(s)
        hello.seq = self.seq
        return hello

    def _take(self, s: int, frames: list) -> bool:
        """Handle one arrival; True if it was from this round trip (a sign of life)."""
        n = sum(memoryview(f).nbytes for f in frames)
        self.c.wire.received += n
        try:
            reply = decode(frames)
        except ProtocolError as exc:
            raise PSError(s, exc.code, f"undecodable reply: {exc.message}") from None
        if reply.type is MsgType.WEIGHTS:  # a stale one too: it came over the wire
            self.c.wire.pulled += n
        if reply.seq != self.seq or self.replies[s] is not None:
            log.debug("worker %d: dropped a stale reply (seq %d, waiting for %d)", self.c.worker, reply.seq, self.seq)
            return False
        if reply.type is MsgType.OK and "probe" in reply.fields:
            self.probing[s] = False
            if isinstance(reply.fields.get("replicas"), list):  # a request held long follows the shard's replicas
                self.c.addresses.heard(s, reply.fields["replicas"])
            if not reply.fields.get("holding"):  # the request, or its answer, was lost
                self._resend(s)
            return True
        if reply.type is MsgType.WELCOME and self.greeting[s]:
            self.greeting[s] = False
            self._resend(s)
            return True
        if reply.type is MsgType.ERROR:
            f = reply.fields
            if f.get("code") == ErrorCode.NOT_PRIMARY and f.get("replicas"):
                if self.c.addresses.moved(s, f["replicas"]):  # a fenced primary named who serves the shard now: ask there
                    self.probing[s] = False
                    self._resend(s)
                return True
            if f.get("hello") and self.kind != "HELLO":
                if not self.greeting[s]:
                    self.hellos[s] += 1
                    if self.hellos[s] > self.MAX_HELLOS:
                        raise PSError(s, f.get("code", ErrorCode.INTERNAL), f.get("message", ""), fields=f)
                    log.info("worker %d: shard %d does not know us (%s); saying HELLO again",
                             self.c.worker, s, f.get("message"))
                    self.greeting[s] = True
                    self._out(s, [encode(self._hello(s))])
                return True
            error = PSError(s, f.get("code", ErrorCode.INTERNAL), f.get("message", ""), fields=f)
            if self.kind != "HELLO":
                raise error
            if self.refused is None:
                self.refused, self.refused_by = error, time.monotonic() + self.REFUSED_WAIT
            self.replies[s] = reply
            return True
        self.replies[s] = reply
        self._record(s, reply)
        if isinstance(reply.fields.get("replicas"), list):  # the shard's replicas now (failovers, replacements)
            self.c.addresses.heard(s, reply.fields["replicas"])
        return True

    def _record(self, s: int, reply: Message) -> None:
        """The answer from shard s in the history (docs/history.md): a push acknowledged, weights taken."""
        f, history = reply.fields, self.c.history
        where = {"w": self.c.worker, "seq": self.seq, "shard": s}
        if self.pushing:
            push = f if reply.type is MsgType.OK else f.get("push", {})
            history.record("ack", **where, epoch=f.get("epoch", 0), version=push.get("version"),
                           dropped=push.get("dropped"), **{"from": self.c.servers[s]})
        if reply.type is MsgType.WEIGHTS:
            history.record("pull", **where, clock=self.msgs[s].clock, version=f.get("version"), epoch=f.get("epoch", 0))


class PushPull:
    """A push_pull whose shards are sent one by one as their gradient slices become final."""

    def __init__(self, client: "PSClient", rt: RoundTrip, grad: torch.Tensor, out: torch.Tensor):
        self.client, self.rt, self.grad, self.out = client, rt, grad, out
        self.early = 0  # shards sent before finish()

    def ready(self, shard: int) -> None:
        if self.rt.frames[shard] is None:
            self.client.fill_push(self.grad, shard, self.rt.msgs[shard])
            self.rt.send(shard)
            self.early += 1

    def finish(self) -> Reply:
        for s in range(len(self.rt.msgs)):
            if self.rt.frames[s] is None:
                self.client.fill_push(self.grad, s, self.rt.msgs[s])
        return self.client.receive_weights(self.out, self.rt.run)

    def annotate(self, fields: dict) -> None:
        """Add header `fields` to every shard's message not sent yet."""
        for s, m in enumerate(self.rt.msgs):
            if self.rt.frames[s] is None and fields:
                m.fields = {**m.fields, **fields}
