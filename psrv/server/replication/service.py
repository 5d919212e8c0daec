"""A shard's replication, as ShardService (psrv/server/service.py) takes part in it: the stream's messages
it receives (a backup's "join", its primary's ops), a backup's answer to STATS, and a backup's takeover
(docs/reliability.md, "Replicated shards"; the two halves: primary.py, follower.py). A mixin of
ShardService, whose attributes it reads: cfg, transport, replicas, follower, failovers, liveness,
controller, shard, now, summary, handle, history."""
from __future__ import annotations

import logging
import time
from typing import Hashable

from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.server.replication import stream

log = logging.getLogger("psrv.server")


class ShardReplication:
    def on_stream(self, peer: Hashable, frames: list) -> None:
        """A replication message: a backup asking to join (we are the primary), or the primary's stream (we
        follow it); a stream reaching a primary comes from one this shard has replaced, and is fenced."""
        try:
            head, payload = stream.read(frames)
        except ValueError as exc:
            log.warning("shard %d: ignored a malformed replication message: %s", self.cfg.shard, exc)
            return
        if head["op"] == "join":
            if self.follower is None and not self.replicas.fenced:
                self.replicas.join(str(head.get("address", "")), int(head.get("epoch", 0)))
        elif self.follower is not None:
            self.follower.on_stream(peer, head, payload)
        elif head["op"] in ("ack", "gap", "fenced"):
            return
        elif head["epoch"] < self.replicas.epoch:  # an older primary's stream: the shard is ours now
            self.transport.send(peer, stream.frames_of("fenced", self.replicas.epoch))
        else:  # a stream of our epoch or a later one, from another primary: we may be the stale one
            latest = self.replicas.witness.latest() if self.replicas.witness is not None else None
            if latest is not None and latest.epoch > self.replicas.epoch:
                self.replicas.fence(latest.epoch, f"{latest.primary} (witness: {latest.why})")

    def backup_stats(self, peer: Hashable, frames: list) -> bool:
        """A backup answers STATS itself (psrv top, psrv admin), role "backup"; True if `frames` was one."""
        try:
            msg = decode(frames)
        except ProtocolError:
            return False
        if msg.type is not MsgType.STATS:
            return False
        self.transport.send(peer, encode(Message(MsgType.STATS, seq=msg.seq, fields=self.summary())))
        return True

    def try_take_over(self) -> None:
        """The primary has been silent past the bound: claim the next epoch on the witness. Won: this backup
        is the primary. Lost, or the witness has moved on without us (the primary dropped us, another backup
        took over): join whoever serves now."""
        f = self.follower
        try:
            latest = f.witness.latest()
        except OSError as exc:
            log.error("shard %d: could not read the witness %s (%s); still following", self.cfg.shard,
                      f.witness.dir, exc)
            f.heard = self.now()
            return
        if latest is not None and latest.finished:
            log.info("shard %d: the shard finished (every worker left); this backup ends", self.cfg.shard)
            self.stopped = True
            return
        if latest is None or latest.epoch != f.epoch or self.transport.address not in latest.backups:
            f.lost_place(latest.primary if latest is not None else f.primary)
            return
        try:
            won, latest = f.witness.claim(latest.taken_over_by(
                self.transport.address, why=f"take over from {latest.primary}, silent {self.now() - f.heard:.2f}s"))
        except OSError as exc:
            log.error("shard %d: could not claim the shard on the witness %s (%s); still following",
                      self.cfg.shard, f.witness.dir, exc)
            f.heard = self.now() - self.timing.silence / 2  # try again soon
            return
        if won:
            self._take_over(latest)
        else:
            f.lost_place(latest.primary)

    def _take_over(self, config) -> None:
        """This backup is the shard's primary at `config`'s epoch: the workers' requests it held are answered
        now, and each worker has a full worker_timeout to find it."""
        f, self.follower = self.follower, None
        f.close()
        self.replicas.serve_as(config)
        silent = self.now() - f.heard
        self.liveness.look()  # the time it followed is no one's silence
        self.liveness.restart_clocks(self.controller.active)
        self.failovers.append({"epoch": config.epoch, "from": f.primary, "at": time.time(),
                               "silent_s": round(silent, 3), "version": self.shard.version if self.shard else 0})
        log.warning("shard %d: primary %s silent for %.2fs; this backup (%s) takes over at epoch %d, version %d",
                    self.cfg.shard, f.primary, silent, self.transport.address, config.epoch,
                    self.shard.version if self.shard else 0)
        for peer, frames in f.held:
            self.handle(peer, frames)

    def linger_fenced(self) -> None:
        """A fenced primary, before it ends, answers every worker's request for `fenced_linger` seconds with
        NOT_PRIMARY naming the replicas the witness gives the shard now (nothing applied, nothing acknowledged):
        a worker whose request waited here while a backup joined and took over knows of no other live replica,
        and would otherwise look for the shard where it no longer is."""
        r = self.replicas
        while self.now() < r.linger_until:
            item = self.transport.recv(min(0.05, max(0.0, r.linger_until - self.now())))
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
        try:
            msg = decode(frames)
        except ProtocolError:
            return
        self.transport.send(peer, encode(Message(MsgType.ERROR, seq=msg.seq, fields={
            "code": int(ErrorCode.NOT_PRIMARY), "replicas": list(replicas),
            "message": f"shard {self.cfg.shard}: this replica ({self.transport.address}) is {why}; the shard is "
                       f"served by {replicas[0] if replicas else 'no replica the witness names'}"})))
