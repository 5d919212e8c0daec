"""A shard's replication, as ShardService (psrv/server/service.py) takes part in it: the stream's messages
it receives (a backup's "join", its primary's ops), a backup's answer to STATS, and a backup's takeover
(docs/reliability.md, "Replicated shards"; the two halves: psrv/server/replicas.py, follower.py). A mixin of
ShardService, whose attributes it reads: cfg, transport, replicas, follower, failovers, liveness,
controller, shard, now, summary, handle."""
from __future__ import annotations

import logging
import time
from typing import Hashable

from psrv.protocol import Message, MsgType, ProtocolError, decode, encode
from psrv.server import stream

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
                self.replicas.join(str(head.get("address", "")))
        elif self.follower is not None:
            self.follower.on_stream(peer, head, payload)
        else:
            self.transport.send(peer, stream.frames_of("fenced", self.replicas.epoch))

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

    def take_over(self) -> None:
        """This backup becomes the shard's primary at the next epoch: the workers' requests it held are
        answered now, and each worker has a full worker_timeout to find it."""
        f, self.follower = self.follower, None
        f.close()
        self.replicas.epoch = f.epoch + 1
        silent = self.now() - f.heard
        self.liveness.look()  # the time it followed is no one's silence
        self.liveness.restart_clocks(self.controller.active)
        self.failovers.append({"epoch": self.replicas.epoch, "from": f.primary, "at": time.time(),
                               "silent_s": round(silent, 3), "version": self.shard.version if self.shard else 0})
        log.warning("shard %d: primary %s silent for %.1fs; this backup (%s) takes over at epoch %d, version %d",
                    self.cfg.shard, f.primary, silent, self.transport.address, self.replicas.epoch,
                    self.shard.version if self.shard else 0)
        for peer, frames in f.held:
            self.handle(peer, frames)
