"""PSClient: what a worker uses to talk to every shard at once (push, pull, push_pull).

Requests to all shards are sent first and the replies collected after, so shards work
concurrently. Every call returns the versions it saw (ps-lite's timestamps), so staleness
is measured, never guessed.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.server.partition import PartitionPlan
from psrv.transport import create_client

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
    def __init__(self, servers: Sequence[str], plan: PartitionPlan, *, worker: int, world_size: int,
                 transport: str = "zmq", timeout: float = 60.0):
        if len(servers) != plan.num_shards:
            raise ValueError(f"{len(servers)} server addresses for a plan of {plan.num_shards} shards")
        self.plan = plan
        self.worker = worker
        self.world_size = world_size
        self.timeout = timeout
        self.ranges = plan.ranges
        self.versions = [0] * plan.num_shards
        self._seq = 0
        self._net = create_client(transport, list(servers))

    # --- the public face ----------------------------------------------------
    def hello(self) -> list[dict]:
        """Introduce this worker to every shard; raises PSError on a plan mismatch."""
        msgs = [self._msg(MsgType.HELLO, fields={
            "plan_hash": self.plan.hash, "total": self.plan.total, "num_shards": self.plan.num_shards,
            "shard": s, "world_size": self.world_size}) for s in range(self.plan.num_shards)]
        return [m.fields for m in self._round_trip(msgs)]

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
        return self._weights(self._round_trip(self._pushes(MsgType.PUSH_PULL, grad, clock)), out)

    def stats(self) -> list[dict]:
        return [m.fields for m in self._round_trip([self._msg(MsgType.STATS) for _ in self.ranges])]

    def leave(self) -> None:
        self._round_trip([self._msg(MsgType.LEAVE) for _ in self.ranges])

    def close(self) -> None:
        self._net.close()

    def __enter__(self) -> "PSClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- mechanics ----------------------------------------------------------
    def _msg(self, mtype: MsgType, **kw) -> Message:
        return Message(mtype, worker=self.worker, **kw)

    def _pushes(self, mtype: MsgType, grad: torch.Tensor, clock: int) -> list[Message]:
        return [self._msg(mtype, clock=clock, base_version=self.versions[s], tensor=grad[lo:hi])
                for s, (lo, hi) in enumerate(self.ranges)]

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

    def _round_trip(self, msgs: list[Message]) -> list[Message]:
        """Send msgs[s] to shard s (all at once), then wait for every shard's reply."""
        self._seq += 1
        seq = self._seq
        for shard, m in enumerate(msgs):
            m.seq = seq
            self._net.send(shard, encode(m))
        replies: list[Message | None] = [None] * len(msgs)
        deadline = time.monotonic() + self.timeout
        while any(r is None for r in replies):
            left = deadline - time.monotonic()
            got = self._net.recv(max(0.0, left)) if left > 0 else None
            if got is None:
                missing = [s for s, r in enumerate(replies) if r is None]
                raise TimeoutError(f"worker {self.worker}: no reply from shard(s) {missing} "
                                   f"within {self.timeout:.0f}s to {msgs[0].type.name}")
            shard, frames = got
            try:
                reply = decode(frames)
            except ProtocolError as exc:
                raise PSError(shard, exc.code, f"undecodable reply: {exc.message}") from None
            if reply.type is MsgType.ERROR:
                raise PSError(shard, reply.fields.get("code", ErrorCode.INTERNAL), reply.fields.get("message", ""))
            if reply.seq != seq:
                log.debug("worker %d: dropped a stale reply (seq %d, waiting for %d)", self.worker, reply.seq, seq)
                continue
            replies[shard] = reply
        return replies
