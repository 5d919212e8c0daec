"""A backup's half of replication (`psrv serve --backup-of ADDRESS --witness DIR`): join the primary, take its
state, then apply its stream in order, and take the shard over when the primary falls silent
(docs/reliability.md, "Replicated shards").

While it follows, the backup's ShardService is passive: it starts no timer of its own (no worker is
dropped for silence except as the primary's stream says), and its replies go nowhere. A worker's request that
reaches it (a worker that lost the primary) is answered NOT_PRIMARY, naming the primary, while the primary
lives (heard within half the takeover bound, its connection whole): a worker whose primary was busy waiting
for a stalled backup's ack goes back at once instead of trying every replica in turn. Otherwise it is held,
and answered if this backup takes over. Each op is acknowledged when it arrives, before
it is applied: the backup then holds it, and applies the ops in the order they came.

Who the primary is, and whether this backup may take over, is the witness's to say
(psrv/server/replication/witness.py). A backup asks the witness's current primary to join, again every
JOIN_EVERY seconds until the state comes: a primary always answers a join, with the state, once it has
added the backup at a new epoch. Once nothing came from its primary for `silence` seconds (the primary
pings an idle stream), the backup claims the next epoch on the witness with itself as primary. It wins only
if its primary has not changed the configuration since (a primary that dropped it, for a late ack, has:
the backup then asks it to join again); of several backups claiming at once, one wins and the others join
it. A stream op of an older epoch is answered "fenced", so a paused primary that comes back stops.
"""
from __future__ import annotations

import logging
from typing import Callable, Hashable

from psrv.server.replication import stream
from psrv.server.replication.witness import Witness

log = logging.getLogger("psrv.server")

JOIN_EVERY = 0.25     # a backup not yet following says "join" this often
JOIN_NOTICE = 10.0    # and says in the log that it still waits this often


class Follower:
    """What a backup of `replication`'s shard (psrv/server/replication/handler.py) does while it follows: it
    reads the shard's state (`replication.state`), uses the handler's timing, faults, epoch (the handler holds
    it), `not_primary` and `load_replica_state`, and its service's `apply`, `pause`, `membership` (an expiry)
    and `pulls` (the pull copies' numbers)."""

    def __init__(self, replication, primary: str):
        """`primary`: the address to follow, or several, comma-separated: the replicas of a shard, of which
        whichever is the primary will answer (the witness says which, once it has a configuration)."""
        cfg = replication.state.cfg
        if not cfg.witness:
            raise ValueError("--backup-of needs --witness DIR: a directory this backup and its primary both reach "
                             "(the same path on every replica of the shard), where the shard's epochs are decided")
        self.s = replication
        self.state = replication.state
        self.witness = Witness(cfg.witness, cfg.shard)
        self.address = self.state.transport.address
        self.candidates = primary.split(",")  # whom to ask before the witness names a primary
        self.primary = self.candidates[0]
        self.link = self.state.transport.link(self.primary)  # on the shard's own transport
        self.expected: int | None = None  # the next op's number; None until the state came
        self.replicas: list[str] = []
        self.heard = self.state.now()
        self.retry_at = -float("inf")  # after a witness it could not read or claim on: when to try again
        self._asked = -float("inf")
        self._said = self.state.now()  # when we last said we still wait to join (every JOIN_NOTICE seconds)
        self.on_following: Callable[[], None] | None = None  # called once, when the primary's state came
        self.refused: str = ""  # a primary that cannot take backups said why
        self.held: list[tuple[Hashable, list]] = []  # workers' requests while we follow

    @property
    def following(self) -> bool:
        return self.expected is not None

    def hold(self, peer: Hashable, frames: list) -> None:
        """A worker's request while we follow: sent back to a live primary, else answered if we take over."""
        if self.primary_live():
            self._send_back_one(peer, frames)
        else:
            self.held.append((peer, [bytes(memoryview(f)) for f in frames]))

    def primary_live(self) -> bool:
        """Following a primary heard from within half the takeover bound, whose connection has not broken (a
        killed primary's breaks at once)."""
        if not self.following:
            return False
        self.link.recv(0)  # reads the link's connection events: nothing else comes on it while we follow
        return not self.link.down(0) and self.state.now() - self.heard < self.s.timing.silence / 2

    def _send_back(self) -> None:
        """The primary was heard again: the workers' requests held meanwhile go back to it."""
        held, self.held = self.held, []
        for peer, frames in held:
            self._send_back_one(peer, frames)

    def _send_back_one(self, peer: Hashable, frames: list) -> None:
        self.s.not_primary(peer, frames, self.replicas or [self.primary], "a backup")

    def on_stream(self, peer: Hashable, head: dict, payload: list) -> None:
        """One message of the primary's stream, acknowledged and applied in order."""
        op, epoch = head["op"], head["epoch"]
        if op == "refused":
            self.refused = str(head.get("why", "the primary refused this backup"))
            return
        if epoch < self.s.epoch:
            self._say(peer, "fenced")
            return
        if op == "state":
            self._take_state(peer, head, payload)
            return
        if not self.following:
            return  # ops before our state: it is on its way
        if epoch > self.s.epoch and not self._confirm(epoch):
            return
        self.heard = self.state.now()
        self._send_back()  # the primary lives: the workers that came here go back to it
        if op == "ping":
            self._say(peer, "ack", n=self.expected - 1)
            return
        if int(head.get("n", -1)) != self.expected:
            log.warning("shard %d: op %s came, op %d expected; asking for the state again", self.state.cfg.shard,
                        head.get("n"), self.expected)
            self.expected = None
            self._say(peer, "gap", n=head.get("n"))
            return
        late = self.s.faults.late_ack() if self.s.faults is not None else 0.0
        if late:  # a nemesis's late ack: this loop stalls, as a backup's does when its host is starved
            self.s.service.pause(late)
        self._say(peer, "ack", n=self.expected)
        self.expected += 1
        if op == "req":
            self.s.service.apply(head.get("peer"), payload, judged=head.get("judged"))
        elif op == "expire":
            self.s.service.membership.expire([int(w) for w in head.get("workers", [])],
                                             [int(w) for w in head.get("unheard", [])])

    def _take_state(self, peer: Hashable, head: dict, payload: list) -> None:
        """The primary added us at `epoch` and sends its state: we follow from op n."""
        epoch = head["epoch"]
        replicas = [str(r) for r in head.get("replicas", [])]
        self.s.load_replica_state(stream.state_from(payload[0]) if payload else None,
                                  source=f"primary {replicas[0] if replicas else self.primary}'s state")
        self.s.service.pulls.copies.numbers = head.get("pull_numbers", self.s.service.pulls.copies.numbers)
        self.s.epoch, self.expected, self.replicas = epoch, int(head["n"]) + 1, replicas
        self.primary = replicas[0] if replicas else self.primary
        self.heard = self.state.now()
        self._send_back()
        self.state.history.record("state", **{"from": self.primary}, n=self.expected - 1, epoch=epoch)
        self.state.history.record("epoch", epoch=epoch, role="backup", primary=self.primary)
        log.info("shard %d: following %s from op %d (epoch %d)", self.state.cfg.shard, self.primary,
                 self.expected - 1, epoch)
        self._say(peer, "ack", n=self.expected - 1)
        if self.on_following is not None:
            self.on_following, announce = None, self.on_following
            announce()

    def _confirm(self, epoch: int) -> bool:
        """Our primary's stream moved to `epoch` (it added or dropped another backup): follow on if the witness
        says so, with us still a backup of that primary."""
        config = self.witness.read(epoch)
        if config is None or config.primary != self.primary or self.address not in config.backups:
            log.warning("shard %d: a stream op at epoch %d that the witness does not give to %s with this backup; "
                        "ignored", self.state.cfg.shard, epoch, self.primary)
            return False
        self.s.epoch = epoch
        self.state.history.record("epoch", epoch=epoch, role="backup", primary=self.primary)
        return True

    def _say(self, peer: Hashable, op: str, **fields) -> None:
        self.state.transport.send(peer, stream.frames_of(op, self.s.epoch, **fields))

    def tick(self) -> bool:
        """Every turn of the loop; True when the primary has been silent long enough to claim the shard."""
        now = self.state.now()
        if not self.following:
            if now - self._asked >= JOIN_EVERY:
                self._asked = now
                self._ask()
            while self.link.recv(0) is not None:
                pass
            if now - self._said >= JOIN_NOTICE:
                self._said = now
                log.warning("shard %d: this backup has waited %.0fs to join its primary at %s; is `psrv serve` "
                            "running there?", self.state.cfg.shard, now - self.heard, self.primary)
            return False
        return now - self.heard >= self._bound() and now >= self.retry_at

    def _bound(self) -> float:
        backups = self.replicas[1:]
        rank = backups.index(self.address) if self.address in backups else 0
        return self.s.timing.silence * (1 + 0.5 * rank)  # the first backup claims first

    def lost_place(self, primary: str) -> None:
        """The witness gave the shard to `primary` at a later epoch than ours: follow it again, from its state."""
        log.warning("shard %d: the witness says %s serves this shard now; this backup joins it again",
                    self.state.cfg.shard, primary)
        self.expected, self.held = None, []
        self._asked = -float("inf")
        self._target(primary)

    def _ask(self) -> None:
        """Say "join" to the shard's primary: the witness's, or before it has one, the next candidate. A shard
        its witness says finished has nothing to join: this backup ends too."""
        latest = self.witness.latest()
        if latest is not None and latest.finished:
            log.info("shard %d: the shard finished (every worker left) while this backup was joining; it ends",
                     self.state.cfg.shard)
            self.state.stopped = True
            return
        if latest is not None and latest.primary != self.address:
            self._target(latest.primary)
        elif latest is None and len(self.candidates) > 1:
            self._target(self.candidates[(self.candidates.index(self.primary) + 1) % len(self.candidates)]
                         if self.primary in self.candidates else self.candidates[0])
        self.link.send(0, stream.frames_of("join", self.s.epoch, address=self.address))

    def _target(self, address: str) -> None:
        if address != self.primary:
            self.link.close()
            self.primary, self.link = address, self.state.transport.link(address)

    def close(self) -> None:
        self.link.close()
