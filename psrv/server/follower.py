"""A backup's half of replication (`psrv serve --backup-of ADDRESS`): join the primary, take its state, then
apply its stream in order, and take over when it falls silent (docs/reliability.md, "Replicated shards").

While it follows, the backup's ShardService is passive: it starts no timer of its own (no worker is
dropped for silence except as the primary's stream says), its replies go nowhere, and a worker's request
that reaches it (a worker that lost the primary) is held. Each op is acknowledged when it arrives, before
it is applied: the backup then holds it, and applies the ops in the order they came.

Takeover: the primary pings an idle stream every psrv/server/replicas.py PING_EVERY seconds; once nothing
came from it for the transport's `silence_tolerance` seconds (1 s over ZeroMQ, longer over torch RPC,
psrv/transport/torch_rpc.py), the backup asks it once more to take it ("join": a primary that is
alive but had dropped this backup, for a late ack, answers with its state, and the backup follows again);
with no answer within CHECK_GRACE seconds the backup becomes the primary at the next epoch, answers the held
requests, and refuses the old primary's stream from then on ("fenced"), so the old one, if it was only
paused, stops. Only the first backup in the primary's list takes over at once; the k-th waits k times
longer and, meanwhile, asks the ones before it to let it join them.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

from psrv.server import stream

log = logging.getLogger("psrv.server")

JOIN_EVERY = 0.5      # a backup not yet following says "join" this often
JOIN_NOTICE = 10.0    # and says in the log that it still waits this often
CHECK_GRACE = 0.5     # a silent primary is asked to take the backup again; no state within this: take over


class Follower:
    """`service` is the passive ShardService (psrv/server/service.py) it feeds; used through its public
    members: cfg, transport, shard, pulls, fragments, load_state_dict, apply, expire, take_over, now."""

    def __init__(self, service, primary: str):
        """`primary`: the address to follow, or several, comma-separated: the replicas of a shard, of which
        whichever is the primary will answer (a replacement backup started after a failover)."""
        self.s = service
        self.candidates = primary.split(",")  # whom to ask to join, in turn, until one sends its state
        self.primary = self.candidates[0]
        self.link = service.transport.link(self.primary)  # on the shard's own transport
        self.epoch = 0
        self.expected: int | None = None  # the next op's number; None until the state came
        self.replicas: list[str] = []
        self.heard = service.now()
        self._asked = -float("inf")
        self._said = service.now()  # when we last said we still wait to join (every JOIN_NOTICE seconds)
        self.on_following: Callable[[], None] | None = None  # called once, when the primary's state came
        self._checked: float | None = None  # when we asked a silent primary to take us again, before taking over
        self.held: list[tuple[Hashable, list]] = []  # workers' requests while we follow

    @property
    def following(self) -> bool:
        return self.expected is not None

    def hold(self, peer: Hashable, frames: list) -> None:
        """A worker's request while we follow: answered if we take over (the primary may be gone)."""
        self.held.append((peer, [bytes(memoryview(f)) for f in frames]))

    def on_stream(self, peer: Hashable, head: dict, payload: list) -> None:
        """One message of the primary's stream, acknowledged and applied in order."""
        op, epoch = head["op"], head["epoch"]
        if epoch < self.epoch:
            self._say(peer, "fenced")
            return
        self.heard = self.s.now()
        self._checked = None
        self.held.clear()  # the primary lives: the workers that came here go back to it
        if op == "state":
            if payload:
                state = stream.state_from(payload[0])
                pulls, fragments = state.pop("pulls", None), state.pop("fragments", None)
                self.s.load_state_dict(state, source=f"primary {self.primary}'s state")
                if pulls is not None:
                    self.s.pulls.load_state_dict(pulls, self.s.shard.size, self.s.shard.device)
                if fragments is not None:
                    self.s.fragments.load_state_dict(fragments, self.s.shard)
            self.s.pulls.numbers = head.get("pull_numbers", self.s.pulls.numbers)
            self.epoch, self.expected, self.replicas = epoch, int(head["n"]) + 1, list(head.get("replicas", []))
            self.primary = self.replicas[0] if self.replicas else self.primary
            log.info("shard %d: following %s from op %d (epoch %d)", self.s.cfg.shard, self.primary,
                     self.expected - 1, epoch)
            self._say(peer, "ack", n=self.expected - 1)
            if self.on_following is not None:
                self.on_following, announce = None, self.on_following
                announce()
            return
        if not self.following:
            return  # ops before our state: it is on its way
        if op == "ping":
            self._say(peer, "ack", n=self.expected - 1)
            return
        if int(head.get("n", -1)) != self.expected:
            log.warning("shard %d: op %s came, op %d expected; asking for the state again", self.s.cfg.shard,
                        head.get("n"), self.expected)
            self.expected = None
            self._say(peer, "gap", n=head.get("n"))
            return
        self._say(peer, "ack", n=self.expected)
        self.expected += 1
        if op == "req":
            self.s.apply(head.get("peer"), payload)
        elif op == "expire":
            self.s.expire([int(w) for w in head.get("workers", [])], [int(w) for w in head.get("unheard", [])])

    def _say(self, peer: Hashable, op: str, **fields) -> None:
        self.s.transport.send(peer, stream.frames_of(op, self.epoch, **fields))

    def tick(self) -> bool:
        """Every turn of the loop; True when this backup must take over now."""
        now = self.s.now()
        if not self.following:
            if now - self._asked >= JOIN_EVERY:
                self._asked = now
                self._ask(self.candidates[int(now / JOIN_EVERY) % len(self.candidates)])
            while self.link.recv(0) is not None:
                pass
            if now - self._said >= JOIN_NOTICE:
                self._said = now
                log.warning("shard %d: this backup has waited %.0fs to join its primary at %s; is `psrv serve` "
                            "running there?", self.s.cfg.shard, now - self.heard, self.primary)
            return False
        silent, after = now - self.heard, self.s.transport.silence_tolerance
        rank = self._rank()
        if silent < after * (rank + 1):
            if silent >= after and rank > 0:  # the primary is gone: join the first backup that took over
                self._ask_earlier(rank)
            return False
        if self._checked is None:  # one last question: a live primary that had dropped us answers with its state
            self._checked = now
            self._ask(self.primary)
            return False
        return now - self._checked >= CHECK_GRACE

    def _rank(self) -> int:
        """Our place among the backups in the primary's list (0: we take over first)."""
        mine = self.s.transport.address
        backups = self.replicas[1:]
        return backups.index(mine) if mine in backups else 0

    def _ask_earlier(self, rank: int) -> None:
        earlier = self.replicas[1:1 + rank]
        if not earlier or self.s.now() - self._asked < JOIN_EVERY:
            return
        self._asked = self.s.now()
        self._ask(earlier[int(time.monotonic() / JOIN_EVERY) % len(earlier)])

    def _ask(self, target: str) -> None:
        """Say "join" to `target` (a fresh link where it is another than the last one asked)."""
        if target != self.primary:
            self.link.close()
            self.primary, self.link = target, self.s.transport.link(target)
        self.link.send(0, stream.frames_of("join", self.epoch, address=self.s.transport.address))

    def close(self) -> None:
        self.link.close()
