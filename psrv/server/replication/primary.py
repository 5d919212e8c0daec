"""The primary's half of replication: its backups, the stream of what it applies, and replies held until
every backup of its configuration holds what they acknowledge (docs/reliability.md, "Replicated shards").

Primary-backup, op-based. Every request that can change the shard's state (HELLO, INIT, PUSH, PULL,
PUSH_PULL, LEAVE) is forwarded to each backup as its own frames, in the order the primary applies them (sent
as it starts on one, so the acks travel while it works), and so is each decision the primary takes on its
own (workers dropped for silence), with the judgement of time a request's handling needs (a worker's
silence). The backups run the same ShardService code on the same ops in the same order, so their state
equals the primary's. Replies are kept in `outbox` while a request is handled and leave only once every
backup of the configuration has acknowledged every op sent so far (acks are cumulative), so no worker hears
of an update a backup does not hold; an op that made no reply (a push's chunk but its last) is not waited for
by itself, so a chunked push's chunks go back to back and their acks are waited for once.

Every change of the configuration is a claim on the shard's witness (psrv/server/replication/witness.py):
a backup that asks to join is added at the next epoch, then sent the state; one that does not acknowledge
within `ack_timeout` is dropped at the next epoch, and only then does the primary go on without it. A claim
lost means another replica took the shard over: this primary is fenced and stops, its held replies unsent
(for a little while it answers every worker's request NOT_PRIMARY, naming who serves the shard now:
service.py linger_fenced).
So a primary never acknowledges alone on its own say, and a backup it dropped cannot take over.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Hashable

from psrv.protocol import MsgType
from psrv.server.replication import stream
from psrv.server.replication.witness import Configuration, Witness
from psrv.transport import ClientTransport

log = logging.getLogger("psrv.server")

REPLICATED = (MsgType.HELLO, MsgType.INIT, MsgType.PUSH, MsgType.PULL, MsgType.PUSH_PULL, MsgType.LEAVE)
AWAIT_BACKUPS = 60.0  # seconds a primary told of its backups (rpc_backups) holds the workers' requests for them
RETRY_CLAIM = 0.5     # seconds between claims on a witness that could not be written (a full disk)
# seconds a backup's link must stay broken before it is dropped for it: a killed process's stays broken, but a
# connection of a live one that broke comes back within zmq's reconnect interval (0.1 s), as the conformance
# matrix saw now and then on loaded machines (the cause is not found; docs/reliability.md)
LINK_SETTLE = 0.5


@dataclass
class Backup:
    address: str
    link: ClientTransport
    acked: int = -1  # the last op it acknowledged: it holds every op up to that one (the state's: its n)
    since: int = 0  # the epoch at which it was added: a "join" it said before that is stale


class Replicas:
    """The backups of `replication`'s shard (psrv/server/replication/handler.py) while it is the primary: it
    reads the shard's state (`replication.state`) and uses the handler's timing (psrv/timeouts.py),
    `replica_state` and epoch (the handler holds it: `serve_as` sets it), and its service's `sent`, `handle`
    and `pushes` (a chunked push half applied holds a join back)."""

    def __init__(self, replication):
        self.s = replication
        self.state = replication.state
        cfg = replication.state.cfg
        self.witness = Witness(cfg.witness, cfg.shard) if cfg.witness else None
        self.config: Configuration | None = None  # this primary's configuration, once claimed
        self.backups: list[Backup] = []   # the configuration's backups, each sent the state
        self.joining: list[str] = []      # backups that asked to join: added once nothing is half done
        self.n = 0                        # ops sent so far
        self.unacked: int | None = None   # the last op sent whose acks no reply has waited for yet (settle)
        self.outbox: list[tuple[Hashable, list, dict | None]] | None = None
        self.fenced = False
        self.linger_until = -float("inf")  # once fenced: until when it tells workers where the shard went
        self.admitted = 0                 # backups sent the state so far (a backup asking again counts again)
        self._pinged = self.state.now()
        self._blocked_until = -float("inf")  # after a claim the witness could not take: when to try again
        # Over torch RPC a primary knows how many backups its world holds (`rpc_backups`): the workers' requests
        # wait until they have joined (at most AWAIT_BACKUPS s), so none joins after the first pushes and every
        # replica counts what its primary counts. Over zmq `psrv run` starts the workers once the backups follow.
        self.expected = 0 if cfg.backup_of else int(getattr(cfg, "rpc_backups", 0) or 0)
        self.early: list[tuple[Hashable, list]] = []
        self._started = self.state.now()

    @property
    def epoch(self) -> int:
        return self.s.epoch

    @property
    def addresses(self) -> list[str]:
        """This shard's replicas as workers are told them (WELCOME's `replicas`): this one, then its backups."""
        return [self.state.transport.address, *(b.address for b in self.backups)]

    def said(self) -> dict:
        """What every push and pull answer says of the shard's replication: its epoch, and with a witness the
        replicas serving it now, so a worker follows the shard through failovers and replacements."""
        return {"epoch": self.epoch, **({"replicas": self.addresses} if self.witness is not None else {})}

    # --- the configuration ------------------------------------------------------
    def begin(self) -> None:
        """A primary started with a witness claims epoch 0; ValueError if the shard already has one."""
        if self.witness is None:
            return
        address = self.state.transport.address
        won, latest = self.witness.claim(Configuration(0, address, (), "start"))
        if not won:
            raise ValueError(f"shard {self.state.cfg.shard}'s witness {self.witness.dir} already holds epoch "
                             f"{latest.epoch}, served by {latest.primary}: another primary serves this shard; "
                             f"start this server with --backup-of that address, or give it a fresh --witness")
        self.serve_as(latest)

    def serve_as(self, config: Configuration) -> None:
        """This replica serves `config` as its primary from now (its start, a takeover, a change it claimed)."""
        self.config = config
        self.s.epoch = config.epoch
        self.state.history.record("epoch", epoch=config.epoch, role="primary", primary=config.primary,
                              backups=list(config.backups))

    def _claim(self, config: Configuration) -> bool:
        """Claim `config` on the witness: True once it is this shard's; False if the witness could not be written
        (try again later); fenced (and False) if another replica claimed the epoch first."""
        try:
            won, latest = self.witness.claim(config)
        except OSError as exc:
            self._blocked_until = self.state.now() + RETRY_CLAIM
            log.error("shard %d: could not claim epoch %d on the witness %s (%s); acknowledging nothing until it "
                      "can", self.state.cfg.shard, config.epoch, self.witness.dir, exc)
            return False
        if not won:
            self.fenced_by(latest)
            return False
        self.serve_as(config)
        return True

    # --- replies held for the backups' acks -------------------------------------
    @contextlib.contextmanager
    def deferring(self):
        """Hold the replies made inside the block until every op sent is acknowledged, then send them (none
        once fenced). Without backups replies go out at once, as they always did."""
        if not self.backups:
            yield
            return
        self.outbox = []
        try:
            yield
        finally:
            held, self.outbox = self.outbox, None
            if held and not self.fenced:
                self.settle()
            for peer, frames, note in held if not self.fenced else ():
                self.s.service.sent(peer, frames, note)

    def hold(self, peer: Hashable, frames: list, note: dict | None) -> bool:
        """Keep a reply for the end of `deferring` (True), or leave it to be sent now (False), once every backup
        holds every op sent so far."""
        if self.outbox is None:
            self.settle()
            return False
        self.outbox.append((peer, frames, note))
        return True

    def protect(self) -> None:
        """The weights are about to be written: the held replies that view them get a copy (rare: a reply
        with weights is mostly made after the write its request brought)."""
        for i, (peer, frames, note) in enumerate(self.outbox or ()):
            if len(frames) > 1 and not isinstance(frames[1], bytes):
                self.outbox[i] = (peer, [frames[0], *(bytes(memoryview(f)) for f in frames[1:])], note)

    # --- the stream ---------------------------------------------------------------
    def send(self, op: str, payload: list | tuple = (), **fields) -> None:
        """Send op to every backup without waiting: the primary applies it meanwhile, so the acks travel while
        it works, and the next reply to leave waits for them (settle)."""
        if not self.backups:
            return
        if not all(b.link.in_order for b in self.backups):  # (torch RPC) op n+1 could overtake op n: one at a time
            self.settle()
        self.n += 1
        frames = stream.frames_of(op, self.epoch, payload, n=self.n, **fields)
        for b in self.backups:
            b.link.send(0, frames)
        self._pinged = self.state.now()
        self.unacked = self.n

    def settle(self) -> None:
        """Until every backup acknowledged every op sent so far, was dropped at a new epoch, or we were fenced."""
        n, self.unacked = self.unacked, None
        for b in list(self.backups) if n is not None else ():
            self._await(b, n)

    def _await(self, b: Backup, n: int) -> None:
        """Until backup b acknowledged op n; dropped at a new epoch if it does not within the ack timeout, or
        once its connection has stayed broken for LINK_SETTLE (its process ended: a kill -9 closes its sockets
        at once, and nothing comes back). The other backups are pinged meanwhile: a backup that hears nothing
        while its primary waits on another would take the shard over from a live primary."""
        bound = self.s.timing.ack_timeout
        deadline = time.monotonic() + bound
        broke_at = None  # when the link was first seen broken (None: it is up)
        while not self.fenced and b in self.backups and b.acked < n:
            now = time.monotonic()
            broke_at = (broke_at or now) if b.link.down(0) else None
            if broke_at is not None and now - broke_at >= LINK_SETTLE:
                why = "its connection broke (its process ended)"
            else:
                self._ping()
                wait = min(deadline - now, self.s.timing.ping_every)
                if broke_at is not None:  # look again once it had the time to come back
                    wait = min(wait, broke_at + LINK_SETTLE - now)
                got = b.link.recv(max(0.0, wait))
                if got is not None:
                    if self._answer(b, got[1], n):
                        return
                    continue
                if time.monotonic() < deadline:
                    continue
                why = f"no ack of op {n} within {bound:g}s"
            log.warning("shard %d: backup %s: %s; dropping it at the next epoch", self.state.cfg.shard, b.address, why)
            if self._drop(b, why=f"drop {b.address}: {why}"):
                return
            deadline = time.monotonic() + RETRY_CLAIM  # the witness was out of reach: wait for the ack on

    def _ping(self) -> None:
        """A ping to every backup where the stream has been quiet for ping_every (the backups' sign that the
        primary lives): from the loop's tick, and inside a wait for acks, where the tick does not run."""
        if self.backups and self.state.now() - self._pinged >= self.s.timing.ping_every:
            self._pinged = self.state.now()
            for b in self.backups:
                b.link.send(0, stream.frames_of("ping", self.epoch, n=self.n))

    def _answer(self, b: Backup, frames: list, n: int) -> bool:
        """Take one answer of backup b; True once it acknowledged op n (or is no longer waited for)."""
        try:
            head, _ = stream.read(frames)
        except ValueError:
            return False
        if head["op"] == "fenced":
            self.fence(int(head.get("epoch", 0)), b.address)
            return True
        if head["op"] == "gap":  # it missed an op: dropped, it joins again from the state
            if self._drop(b, why=f"drop {b.address}: it missed op {head.get('n')}"):
                self.join(b.address)
            return b not in self.backups
        if head["op"] == "ack":
            b.acked = max(b.acked, int(head.get("n", -1)))
        return b.acked >= n

    def _drop(self, b: Backup, *, why: str) -> bool:
        """Backup b leaves the configuration at a claimed epoch; False if no claim could be made (or we were
        fenced), in which case nothing is acknowledged without it."""
        if not self._claim(self.config.without(b.address, why=why)):
            return self.fenced
        self.backups.remove(b)
        b.link.close()
        return True

    def fenced_by(self, latest: Configuration) -> None:
        """Fenced by the witness's `latest` configuration, a later one than ours."""
        self.fence(latest.epoch, f"{latest.primary} (witness: {latest.why})" if latest.primary else "")

    def fence(self, epoch: int, by: str) -> None:
        """Stop acknowledging: `by` (a replica's address, with what the witness says of it) holds the shard at
        `epoch`; an empty `by` is the witness's last word, the shard finished while this primary was cut off."""
        if self.fenced:
            return
        if by:
            log.error("shard %d: %s took this shard over at epoch %d (this primary's is %d); this primary stops "
                      "without answering", self.state.cfg.shard, by, epoch, self.epoch)
        else:
            log.error("shard %d: the witness says the shard finished at epoch %d (this primary's is %d), served "
                      "by another replica meanwhile; this primary stops without answering", self.state.cfg.shard,
                      epoch, self.epoch)
        self.state.history.record("fenced", epoch=epoch, by=by)
        self.fenced = True
        self.linger_until = self.state.now() + self.s.timing.fenced_linger
        self.state.stopped = True

    # --- joining ------------------------------------------------------------------
    def awaiting(self, peer: Hashable, frames: list) -> bool:
        """True, keeping the request to answer later, while this primary waits for its expected backups."""
        if not self.expected or len(self.backups) >= self.expected or self._late():
            return False
        self.early.append((peer, frames))
        return True

    def _late(self) -> bool:
        late = self.state.now() - self._started > AWAIT_BACKUPS
        if late and self.expected:
            log.warning("shard %d: %d of %d backups joined within %gs; serving without the others",
                        self.state.cfg.shard, len(self.backups), self.expected, AWAIT_BACKUPS)
            self.expected = 0
        return late

    def join(self, address: str, epoch: int = 0) -> None:
        """A backup asked to follow this shard: it is added, and sent the state, at the next turn when nothing
        is half done (it asks again every little while until then, and is always answered). A backup already
        added asks again only if it lost track of the stream, from the epoch it was added at or a later one; a
        "join" of an earlier epoch was said before it was added (queued while this primary started, or crossing
        its state) and changes nothing."""
        if self.witness is None or self.config is None:
            link = self.state.transport.link(address)
            link.send(0, stream.frames_of("refused", self.epoch, why=f"shard {self.state.cfg.shard}'s primary at "
                                          f"{self.state.transport.address} has no --witness"))
            link.close()
            return
        if any(b.address == address and epoch < b.since for b in self.backups):
            return
        if address not in self.joining:
            self.joining.append(address)

    def tick(self) -> None:
        """Every turn of the loop: add those joining, ping an idle stream, read acks and fencing."""
        if self.joining and not self.s.service.pushes.chunks.applying and not len(self.s.service.pushes.held) \
                and self.state.now() >= self._blocked_until:
            joining, self.joining = self.joining, []
            for i, address in enumerate(joining):
                if not self._admit(address):
                    self.joining = joining[i:] if not self.fenced else []
                    break
        if self.early and (len(self.backups) >= self.expected or self._late()):
            early, self.early = self.early, []
            for peer, frames in early:  # the requests that waited for the backups, in the order they came
                self.s.service.handle(peer, frames)
        for b in list(self.backups):
            got = b.link.recv(0)
            while got is not None and not self.fenced and b in self.backups:
                self._answer(b, got[1], self.n + 1)
                got = b.link.recv(0) if b in self.backups else None
        self._ping()

    def _admit(self, address: str) -> bool:
        """Add a joining backup at a new epoch and send it the shard's state with what a checkpoint leaves out
        but a backup needs (psrv/server/replication/handler.py replica_state); it then follows the stream. False when no
        claim could be made now."""
        for b in [b for b in self.backups if b.address == address]:  # asking again: it lost track, from the state
            self.backups.remove(b)
            b.link.close()
        if not self._claim(self.config.adding(address, why=f"join {address}")):
            return False
        state = self.s.replica_state()
        link = self.state.transport.link(address)
        payload = [stream.state_bytes(state)] if state is not None else []
        self.backups.append(Backup(address, link, since=self.epoch))  # listed before it can say it follows
        self.state.history.record("sent_state", to=address, n=self.n, epoch=self.epoch)
        link.send(0, stream.frames_of("state", self.epoch, payload, n=self.n, replicas=self.addresses,
                                      pull_numbers=self.s.service.pulls.copies.numbers))
        self.unacked = self.n  # (torch RPC) the next op waits for the state's ack: sent at once, it could overtake
                               # the state, and a backup drops an op that comes before its state
        self.admitted += 1
        log.info("shard %d: backup %s joined at op %d (epoch %d, version %d)", self.state.cfg.shard, address, self.n,
                 self.epoch, self.state.shard.version if self.state.shard is not None else 0)
        return True

    def finish(self) -> None:
        """Every worker left: the witness says the shard is finished, so a backup rejoining it ends too."""
        if self.witness is not None and self.config is not None and not self.fenced:
            try:
                self.witness.claim(self.config.ended())
            except OSError as exc:
                log.warning("shard %d: could not say on the witness that the shard finished (%s)",
                            self.state.cfg.shard, exc)

    def close(self) -> None:
        for b in self.backups:
            b.link.close()
        self.backups = []
