"""A shard's replication (docs/reliability.md, "Replicated shards"): while it is the primary, its backups
(primary.py); while it is a backup, the primary it follows (follower.py); the stream's messages it receives
(a backup's "join", its primary's ops), a backup's answer to STATS, a backup's takeover, what a joining
backup is sent, and the epoch. The epoch is held here and only here: the primary's configuration on the
witness sets it (Replicas.serve_as), a backup's primary's stream while it follows (Follower); every push,
pull and history event of the shard reads it from here."""
from __future__ import annotations

import logging
import time
from typing import Hashable

from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.server.faults import InjectedFaults
from psrv.server.replication import stream
from psrv.server.replication.follower import Follower
from psrv.server.replication.primary import Replicas
from psrv.server.state import ShardState

log = logging.getLogger("psrv.server")


class Replication:
    """`service`: the ShardService (psrv/server/service.py) whose `handle`, `checkpoints` (the state a
    backup is sent) and `pulls` (its copies and waiting pulls, sent too) it uses."""

    def __init__(self, state: ShardState, service, *, faults: InjectedFaults | None = None):
        self.state = state
        self.service = service
        self.faults = faults  # a nemesis's injected faults this replica obeys (psrv/server/faults.py)
        self.timing = state.cfg.timeouts(state.transport.silence_tolerance)  # failover timeouts (psrv/timeouts.py)
        self.epoch = 0  # the epoch this replica serves or follows (0 without replication)
        self.failovers: list[dict] = []  # when this backup took over
        self.replicas = Replicas(self)
        self.follower = Follower(self, state.cfg.backup_of) if state.cfg.backup_of else None

    def begin(self) -> None:
        """A primary claims epoch 0 on the witness, if the shard has one."""
        if self.follower is None:
            self.replicas.begin()

    def replica_state(self) -> dict | None:
        """The state a joining backup starts from (docs/reliability.md, "Joining"): the shard's checkpoint
        state (streaming DiLoCo's per-fragment optimizers among it), and what a checkpoint leaves out but a
        backup must hold to go on as its primary would: the workers' compressed-pull copies, the pulls waiting
        for their answer, the counters, who holds each rank, the workers' step speeds, and the workers that sent
        their final pull (a checkpoint's run ends, a backup's goes on: a merge or barrier counting one of them
        would close at another time than its primary's). None while the shard has none (before the first HELLO)."""
        s, pulls = self.state, self.service.pulls
        if s.shard is None:
            return None
        return {**self.service.checkpoints.state_dict(), "pulls": pulls.copies.state_dict(),
                "pending": pulls.pending.state_dict(), "stats": s.stats.state_dict(),
                "sessions": self.service.membership.sessions.state_dict(), "speeds": dict(s.speeds.seconds),
                "finishing": sorted(s.controller.finishing)}

    def load_replica_state(self, state: dict | None, *, source: str) -> None:
        """Carry on from a primary's replica_state (nothing to load while it had none)."""
        if state is None:
            return
        s, pulls = self.state, self.service.pulls
        state = dict(state)
        extra = {k: state.pop(k, None) for k in ("pulls", "pending", "stats", "sessions", "speeds", "finishing")}
        self.service.checkpoints.load_state_dict(state, source=source, finishing=extra["finishing"] or ())
        s.resumed_from = None  # a backup carries the shard on; it did not resume a checkpoint
        if extra["pulls"] is not None:
            pulls.copies.load_state_dict(extra["pulls"], s.shard.size, s.shard.device)
        if extra["pending"] is not None:
            pulls.pending.load_state_dict(extra["pending"], received=s.now())
        if extra["stats"] is not None:
            s.stats.load_state_dict(extra["stats"])
        if extra["sessions"] is not None:
            self.service.membership.sessions.load_state_dict(extra["sessions"])
        if extra["speeds"] is not None:
            s.speeds.seconds = {int(w): float(v) for w, v in extra["speeds"].items()}

    def on_stream(self, peer: Hashable, frames: list) -> None:
        """A replication message: a backup asking to join (we are the primary), or the primary's stream (we
        follow it); a stream reaching a primary comes from one this shard has replaced, and is fenced."""
        s = self.state
        try:
            head, payload = stream.read(frames)
        except ValueError as exc:
            log.warning("shard %d: ignored a malformed replication message: %s", s.cfg.shard, exc)
            return
        if head["op"] == "join":
            if self.follower is None and not self.replicas.fenced:
                self.replicas.join(str(head.get("address", "")), int(head.get("epoch", 0)))
        elif self.follower is not None:
            self.follower.on_stream(peer, head, payload)
        elif head["op"] in ("ack", "gap", "fenced"):
            return
        elif head["epoch"] < self.epoch:  # an older primary's stream: the shard is ours now
            s.transport.send(peer, stream.frames_of("fenced", self.epoch))
        else:  # a stream of our epoch or a later one, from another primary: we may be the stale one
            latest = self.replicas.witness.latest() if self.replicas.witness is not None else None
            if latest is not None and latest.epoch > self.epoch:
                self.replicas.fenced_by(latest)

    def backup_stats(self, peer: Hashable, frames: list) -> bool:
        """A backup answers STATS itself (psrv top, psrv admin), role "backup"; True if `frames` was one."""
        s = self.state
        try:
            msg = decode(frames)
        except ProtocolError:
            return False
        if msg.type is not MsgType.STATS:
            return False
        s.transport.send(peer, encode(Message(MsgType.STATS, seq=msg.seq, fields=self.service.summary())))
        return True

    def try_take_over(self) -> None:
        """The primary has been silent past the bound: claim the next epoch on the witness. Won: this backup
        is the primary. Lost, or the witness has moved on without us (the primary dropped us, another backup
        took over): join whoever serves now. A later epoch in which the same primary keeps this backup (it added
        or dropped another, then fell silent before its stream said so) is claimed too: no op of that epoch was
        acknowledged, since each needs this backup's ack. A witness that cannot be read, or that holds nothing
        (its files gone), is tried again a bound later, one that cannot take the claim half a bound later;
        meanwhile the backup follows, and holds the workers' requests (`heard` stays when the primary was last
        heard)."""
        s = self.state
        f = self.follower
        try:
            latest = f.witness.latest()
        except OSError as exc:
            log.error("shard %d: could not read the witness %s (%s); still following", s.cfg.shard,
                      f.witness.dir, exc)
            f.retry_at = s.now() + self.timing.silence
            return
        if latest is None:  # this backup follows a configuration the witness held: its files are gone
            log.error("shard %d: the witness %s holds no configuration of this shard; still following",
                      s.cfg.shard, f.witness.dir)
            f.retry_at = s.now() + self.timing.silence
            return
        if latest.finished:
            log.info("shard %d: the shard finished (every worker left); this backup ends", s.cfg.shard)
            s.stopped = True
            return
        if latest.primary != f.primary or s.transport.address not in latest.backups:
            f.lost_place(latest.primary)
            return
        try:
            won, latest = f.witness.claim(latest.taken_over_by(
                s.transport.address, why=f"take over from {latest.primary}, silent {s.now() - f.heard:.2f}s"))
        except OSError as exc:
            log.error("shard %d: could not claim the shard on the witness %s (%s); still following",
                      s.cfg.shard, f.witness.dir, exc)
            f.retry_at = s.now() + self.timing.silence / 2  # try again soon
            return
        if won:
            self._take_over(latest)
        else:
            f.lost_place(latest.primary)

    def _take_over(self, config) -> None:
        """This backup is the shard's primary at `config`'s epoch: the workers' requests it held are answered
        now, and each worker has a full worker_timeout to find it."""
        s = self.state
        f = self.follower
        self.replicas.serve_as(config)  # the epoch first: whoever sees this replica follow no more sees it too
        self.follower = None
        f.close()
        silent = s.now() - f.heard
        s.liveness.look()  # the time it followed is no one's silence
        s.liveness.restart_clocks(s.controller.active)
        self.failovers.append({"epoch": config.epoch, "from": f.primary, "at": time.time(),
                               "silent_s": round(silent, 3), "version": s.shard.version if s.shard else 0})
        log.warning("shard %d: primary %s silent for %.2fs; this backup (%s) takes over at epoch %d, version %d",
                    s.cfg.shard, f.primary, silent, s.transport.address, config.epoch,
                    s.shard.version if s.shard else 0)
        for peer, frames in f.held:
            self.service.handle(peer, frames)

    def linger_fenced(self) -> None:
        """A fenced primary, before it ends, answers every worker's request for `fenced_linger` seconds with
        NOT_PRIMARY naming the replicas the witness gives the shard now (nothing applied, nothing acknowledged):
        a worker whose request waited here while a backup joined and took over knows of no other live replica,
        and would otherwise look for the shard where it no longer is."""
        s = self.state
        r = self.replicas
        while s.now() < r.linger_until:
            item = s.transport.recv(min(0.05, max(0.0, r.linger_until - s.now())))
            if item is None or stream.is_stream(item[1]):
                continue
            peer, frames = item
            if self.backup_stats(peer, frames):
                continue
            try:
                latest = r.witness.latest()
            except OSError:
                latest = None
            self.not_primary(peer, frames, [latest.primary, *latest.backups] if latest is not None and
                             latest.primary else [], "fenced")

    def not_primary(self, peer: Hashable, frames: list, replicas: list, why: str) -> None:
        """Answer a worker's request ERROR NOT_PRIMARY naming the shard's `replicas` (primary first): this replica
        does not serve it (a backup, or a fenced primary); nothing is applied. The worker sends it there again,
        with the same seq (psrv/client/roundtrip.py)."""
        s = self.state
        try:
            msg = decode(frames)
        except ProtocolError:
            return
        s.transport.send(peer, encode(Message(MsgType.ERROR, seq=msg.seq, fields={
            "code": int(ErrorCode.NOT_PRIMARY), "replicas": list(replicas),
            "message": f"shard {s.cfg.shard}: this replica ({s.transport.address}) is {why}; the shard is "
                       f"served by {replicas[0] if replicas else 'no replica the witness names'}"})))
