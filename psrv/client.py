"""PSClient: what a worker uses to talk to every shard at once (push, pull, push_pull).

Requests to all shards are sent first and the replies collected after, so shards work
concurrently. Every call returns the versions it saw (ps-lite's timestamps), so staleness
is measured, never guessed. A request left unanswered is probed and, if the shard no longer
holds it, re-sent with the SAME seq (the shard applies a push at most once); a shard that
forgot this worker (restarted, or dropped it for silence) is greeted again first.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from psrv.heartbeat import Heartbeat
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.partition import PartitionPlan
from psrv.protocol.codec import DTYPES
from psrv.transport import ClientTransport, create_client

log = logging.getLogger("psrv.client")


class PSError(RuntimeError):
    """A shard answered ERROR; `code` is a psrv.protocol.ErrorCode."""

    def __init__(self, shard: int, code: int, message: str):
        super().__init__(f"shard {shard}: {ErrorCode(code).name}: {message}")
        self.shard, self.code, self.message = shard, ErrorCode(code), message


@dataclass
class Reply:
    """What a push/pull saw: per-shard versions plus the worst staleness, wait and clock gap."""

    versions: list[int]
    clock: int = 0
    staleness: int = 0
    waited: float = 0.0
    gap: int = 0
    fields: list[dict] = field(default_factory=list)


class PSClient:
    """`timeout`: seconds without any sign of life from a shard before giving up; `retry_interval`:
    first wait before probing an unanswered request (doubling up to 8x). `wire_dtype`: the dtype
    gradients travel as (bfloat16/float16 halve the push; the shards apply them in float32). `net`
    replaces the transport (tests wrap it to drop or duplicate messages)."""

    def __init__(self, servers: Sequence[str], plan: PartitionPlan, *, worker: int, world_size: int,
                 transport: str = "zmq", timeout: float = 60.0, retry_interval: float = 1.0,
                 curve_keys: str = "", heartbeat: bool = True, wire_dtype: str = "float32",
                 net: ClientTransport | None = None):
        if len(servers) != plan.num_shards:
            raise ValueError(f"{len(servers)} server addresses for a plan of {plan.num_shards} shards")
        self.plan = plan
        self.worker = worker
        self.world_size = world_size
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.ranges = plan.ranges
        self.versions = [0] * plan.num_shards
        if wire_dtype not in DTYPES:
            raise ValueError(f"wire_dtype must be one of {', '.join(DTYPES)}; got {wire_dtype!r}")
        self.wire_dtype = DTYPES[wire_dtype]
        self._wire: torch.Tensor | None = None  # the gradient cast to wire_dtype, reused every push
        self._seq = 0
        self._servers = list(servers)
        self._options = {"curve_keys": curve_keys, "curve_name": f"worker-{worker}"} if curve_keys else {}
        self._net = net or create_client(transport, self._servers, worker=worker, world_size=world_size,
                                         **self._options)
        # zmq sockets are not thread-safe: the heartbeat thread opens its own (rpc has one world per process)
        self._heartbeat_on = heartbeat and transport == "zmq"
        self._heartbeat: Heartbeat | None = None

    # --- the public face ----------------------------------------------------
    def hello(self) -> list[dict]:
        """Introduce this worker to every shard; raises PSError on a plan mismatch."""
        welcomes = [m.fields for m in self._round_trip([self._hello(s) for s in range(self.plan.num_shards)])]
        # A restarted worker continues after its previous life's seqs, so no push of it looks re-sent.
        self._seq = max([self._seq] + [int(w.get("last_seq", 0)) for w in welcomes])
        timeouts = [w["worker_timeout"] for w in welcomes if isinstance(w.get("worker_timeout"), (int, float))]
        if self._heartbeat_on and self._heartbeat is None and timeouts:
            self._heartbeat = Heartbeat(self._servers, worker=self.worker, interval=min(timeouts) / 3,
                                        options=self._options)
            self._heartbeat.start()
        return welcomes

    def init(self, flat: torch.Tensor) -> None:
        """Offer initial weights (rank 0); shards already initialised keep theirs."""
        self._round_trip([self._msg(MsgType.INIT, tensor=flat[lo:hi]) for lo, hi in self.ranges])

    def pull(self, *, clock: int, out: torch.Tensor, final: bool = False) -> Reply:
        """Weights for `clock` copied into `out`; blocks while the shard's controller holds them back."""
        fields = {"final": True} if final else {}
        msgs = [self._msg(MsgType.PULL, clock=clock, fields=fields) for _ in self.ranges]
        return self._weights(self._round_trip(msgs), out)

    def push(self, grad: torch.Tensor, *, clock: int) -> Reply:
        """Push the flat gradient of `clock`, computed on the versions last pulled."""
        replies = self._round_trip(self._pushes(MsgType.PUSH, grad, clock))
        return self._summarise(replies, [r.fields for r in replies])

    def push_pull(self, grad: torch.Tensor, *, clock: int, out: torch.Tensor) -> Reply:
        """Push `clock`'s gradient and pull the weights for clock+1 in one round trip."""
        return self.begin_push_pull(grad, clock=clock, out=out).finish()

    def begin_push_pull(self, grad: torch.Tensor, *, clock: int, out: torch.Tensor) -> "PushPull":
        """push_pull in two halves, to overlap communication with backward: `ready(s)` sends shard s's
        slice as soon as it is final (while backward computes the rest), `finish()` sends whatever is
        left and waits. Nothing else may use this client in between."""
        self._seq += 1
        rt = _RoundTrip(self, self._pushes(MsgType.PUSH_PULL, grad, clock, cast=False), self._seq, self.timeout)
        return PushPull(self, rt, grad, out)

    def stats(self) -> list[dict]:
        return [m.fields for m in self._round_trip([self._msg(MsgType.STATS) for _ in self.ranges])]

    def leave(self) -> None:
        """Say goodbye; a shard that already finished may not answer, which is fine."""
        self._stop_heartbeat()
        try:
            self._round_trip([self._msg(MsgType.LEAVE) for _ in self.ranges], timeout=min(self.timeout, 5.0))
        except TimeoutError as exc:
            log.warning("worker %d: LEAVE not acknowledged (%s)", self.worker, exc)

    def close(self) -> None:
        self._stop_heartbeat()
        self._net.close()

    def __enter__(self) -> "PSClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- mechanics ----------------------------------------------------------
    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    def _msg(self, mtype: MsgType, **kw) -> Message:
        return Message(mtype, worker=self.worker, **kw)

    def _hello(self, shard: int) -> Message:
        return self._msg(MsgType.HELLO, fields={
            "plan_hash": self.plan.hash, "total": self.plan.total, "num_shards": self.plan.num_shards,
            "shard": shard, "world_size": self.world_size})

    def _pushes(self, mtype: MsgType, grad: torch.Tensor, clock: int, *, cast: bool = True) -> list[Message]:
        """One message per shard with its slice of `grad` in the wire dtype. cast=False leaves the
        slices of the wire buffer to be filled later, shard by shard (`_cast`)."""
        if grad.dtype != self.wire_dtype:  # one cast into a buffer kept across steps, no allocation
            if self._wire is None or self._wire.shape != grad.shape or self._wire.device != grad.device:
                self._wire = torch.empty_like(grad, dtype=self.wire_dtype)
            grad = self._wire.copy_(grad) if cast else self._wire
        return [self._msg(mtype, clock=clock, base_version=self.versions[s], tensor=grad[lo:hi])
                for s, (lo, hi) in enumerate(self.ranges)]

    def _cast(self, grad: torch.Tensor, shard: int) -> None:
        """Fill shard's slice of the wire buffer from `grad` (a no-op when grad is already wire dtype)."""
        if grad.dtype != self.wire_dtype:
            lo, hi = self.ranges[shard]
            self._wire[lo:hi].copy_(grad[lo:hi])

    def _weights(self, replies: list[Message], out: torch.Tensor) -> Reply:
        for (lo, hi), r in zip(self.ranges, replies):
            out[lo:hi].copy_(r.tensor, non_blocking=out.is_cuda)
        return self._summarise(replies, [r.fields.get("push", {}) for r in replies])

    def _summarise(self, replies: list[Message], pushes: list[dict]) -> Reply:
        fields = [r.fields for r in replies]
        for s, f in enumerate(fields):
            if "version" in f:
                self.versions[s] = f["version"]
        return Reply(versions=list(self.versions),
                     clock=max((f.get("clock", 0) for f in fields), default=0),
                     staleness=max((p.get("staleness", 0) for p in pushes), default=0),
                     waited=max((f.get("waited", 0.0) for f in fields), default=0.0),
                     gap=max((f.get("gap", 0) for f in fields), default=0), fields=fields)

    def _round_trip(self, msgs: list[Message], *, timeout: float | None = None) -> list[Message]:
        """Send msgs[s] to shard s (all at once), then wait for every shard's reply."""
        self._seq += 1
        return _RoundTrip(self, msgs, self._seq, self.timeout if timeout is None else timeout).run()


class _RoundTrip:
    """One request to every shard, seen through lost messages, lost replies and restarted shards.

    Every retry_interval (doubling) an unanswered shard gets a small HEARTBEAT probe on the same
    connection: a shard that holds the request (a pull it may not answer yet) says so and we wait;
    one that does not gets the request again, same seq. A probe left unanswered means the
    connection or the shard is gone: reconnect and re-send. Any answer counts as a sign of life.
    """

    MAX_HELLOS = 5

    def __init__(self, client: PSClient, msgs: list[Message], seq: int, timeout: float):
        self.c, self.net, self.seq, self.timeout = client, client._net, seq, timeout
        for m in msgs:
            m.seq = seq
        self.msgs = msgs
        self.frames: list[list | None] = [None] * len(msgs)  # encoded when sent: the tensor may still be filling
        self.kind = msgs[0].type.name
        n = len(msgs)
        self.replies: list[Message | None] = [None] * n
        self.probing = [False] * n     # a probe is out and unanswered
        self.greeting = [False] * n    # re-sent HELLO, waiting for WELCOME
        self.hellos = [0] * n

    def send(self, s: int) -> None:
        """Send shard s its request now (once)."""
        if self.frames[s] is None:
            self.frames[s] = encode(self.msgs[s])
            self.net.send(s, self.frames[s])

    def run(self) -> list[Message]:
        for s in range(len(self.msgs)):
            self.send(s)
        interval = self.c.retry_interval
        now = time.monotonic()
        deadline, check_at = now + self.timeout, now + interval
        while None in self.replies:
            now = time.monotonic()
            if now >= deadline:
                missing = [s for s, r in enumerate(self.replies) if r is None]
                raise TimeoutError(f"worker {self.c.worker}: no reply from shard(s) {missing} "
                                   f"within {self.timeout:.0f}s to {self.kind}")
            if now >= check_at:
                self._probe_missing()
                interval = min(interval * 2, 8 * self.c.retry_interval)
                check_at = now + interval
                continue
            got = self.net.recv(min(deadline, check_at) - now)
            if got is not None and self._take(*got):
                deadline = time.monotonic() + self.timeout
        return self.replies

    def _probe_missing(self) -> None:
        for s, r in enumerate(self.replies):
            if r is not None:
                continue
            if self.probing[s]:  # no answer to the last probe either: start a fresh connection
                log.info("worker %d: shard %d silent; reconnecting and re-sending %s seq %d",
                         self.c.worker, s, self.kind, self.seq)
                self.net.reconnect(s)
                self._resend(s)
            probe = Message(MsgType.HEARTBEAT, worker=self.c.worker, seq=self.seq, fields={"probe": self.seq})
            self.net.send(s, encode(probe))
            self.probing[s] = True

    def _resend(self, s: int) -> None:
        self.net.send(s, encode(self.c._hello(s)) if self.greeting[s] else self.frames[s])

    def _take(self, s: int, frames: list) -> bool:
        """Handle one arrival; True if it was from this round trip (a sign of life)."""
        try:
            reply = decode(frames)
        except ProtocolError as exc:
            raise PSError(s, exc.code, f"undecodable reply: {exc.message}") from None
        if reply.seq != self.seq or self.replies[s] is not None:
            log.debug("worker %d: dropped a stale reply (seq %d, waiting for %d)", self.c.worker, reply.seq, self.seq)
            return False
        if reply.type is MsgType.OK and "probe" in reply.fields:
            self.probing[s] = False
            if not reply.fields.get("holding"):  # the request, or its answer, was lost
                self._resend(s)
            return True
        if reply.type is MsgType.WELCOME and self.greeting[s]:
            self.greeting[s] = False
            self.net.send(s, self.frames[s])
            return True
        if reply.type is MsgType.ERROR:
            f = reply.fields
            if f.get("hello") and self.kind != "HELLO":
                if not self.greeting[s]:
                    self.hellos[s] += 1
                    if self.hellos[s] > self.MAX_HELLOS:
                        raise PSError(s, f.get("code", ErrorCode.INTERNAL), f.get("message", ""))
                    log.info("worker %d: shard %d does not know us (%s); saying HELLO again",
                             self.c.worker, s, f.get("message"))
                    self.greeting[s] = True
                    self.net.send(s, encode(self.c._hello(s)))
                return True
            raise PSError(s, f.get("code", ErrorCode.INTERNAL), f.get("message", ""))
        self.replies[s] = reply
        return True


class PushPull:
    """A push_pull whose shards are sent one by one as their gradient slices become final."""

    def __init__(self, client: PSClient, rt: _RoundTrip, grad: torch.Tensor, out: torch.Tensor):
        self.client, self.rt, self.grad, self.out = client, rt, grad, out
        self.early = 0  # shards sent before finish()

    def ready(self, shard: int) -> None:
        if self.rt.frames[shard] is None:
            self.client._cast(self.grad, shard)
            self.rt.send(shard)
            self.early += 1

    def finish(self) -> Reply:
        for s in range(len(self.rt.msgs)):
            if self.rt.frames[s] is None:
                self.client._cast(self.grad, s)
        return self.client._weights(self.rt.run(), self.out)


def admin_request(address: str, kind: MsgType, *, curve_keys: str = "", name: str = "admin",
                  timeout: float = 10.0, transport: str = "zmq") -> dict:
    """One STATS, CHECKPOINT or SHUTDOWN to one shard; its answer's fields (PSError on ERROR).

    CHECKPOINT and SHUTDOWN need a server started with --curve-keys and the client key `name`."""
    options = {"curve_keys": curve_keys, "curve_name": name} if curve_keys else {}
    net = create_client(transport, [address], **options)
    try:
        net.send(0, encode(Message(kind, seq=1)))
        got = net.recv(timeout)
        if got is None:
            raise TimeoutError(f"no answer from {address} within {timeout:.0f}s to {kind.name}")
        reply = decode(got[1])
    finally:
        net.close()
    if reply.type is MsgType.ERROR:
        raise PSError(0, reply.fields.get("code", ErrorCode.INTERNAL), reply.fields.get("message", ""))
    return reply.fields
