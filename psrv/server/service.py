"""The shard's event loop: decode -> handler -> reply, as ps-lite's van calls its request handles.

One thread owns the shard, so a read-modify-write of the parameters is never split. Each request type goes
to the handler of its concern (the `handlers` table): pushes (psrv/server/pushes/), pulls (pulls/), who
works with the shard (membership/), its checkpoints (checkpoints/) and what it says of itself (stats/); its
replication (replication/) sees every request first. The handlers share the shard's state (state.py) and
call each other by name through this service, which sends their replies. Every push it applies,
acknowledges or answers is recorded in its history (psrv/history.py, docs/history.md).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

import torch

from psrv.config import ServerConfig
from psrv.history import History
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.server.checkpoints.handler import Checkpoints
from psrv.server.faults import InjectedFaults
from psrv.server.hierarchy.upstream import Upstream
from psrv.server.membership.handler import Membership
from psrv.server.pulls.handler import Pulls
from psrv.server.pushes.handler import Pushes
from psrv.server.replication import stream
from psrv.server.replication.handler import Replication
from psrv.server.replication.primary import REPLICATED
from psrv.server.shard import Shard
from psrv.server.state import ShardState
from psrv.server.stats.handler import Stats
from psrv.server.validate import HelloAgain
from psrv.transport.base import ServerTransport

log = logging.getLogger("psrv.server")
ADMIN = (MsgType.SHUTDOWN, MsgType.CHECKPOINT)
ANONYMOUS = (MsgType.STATS, *ADMIN)             # no worker id needed
PUSHES = (MsgType.PUSH, MsgType.PUSH_PULL)


class ShardService:
    def __init__(self, cfg: ServerConfig, transport: ServerTransport, *, metrics=None,
                 now: Callable[[], float] = time.monotonic, join_timeout: float | None = None,
                 history: History | None = None, faults: InjectedFaults | None = None):
        """`join_timeout` (default cfg.join_timeout): seconds to wait for a worker never heard from.
        `history`: where its events go (docs/history.md; default nowhere); `faults`: a nemesis's injected
        faults it obeys (psrv/server/faults.py; default none)."""
        self.state = ShardState.fresh(cfg, transport, now=now, history=history or History.off(), metrics=metrics,
                                      join_timeout=cfg.join_timeout if join_timeout is None else join_timeout)
        self.membership = Membership(self.state, self)
        self.pushes = Pushes(self.state, self)
        self.pulls = Pulls(self.state, self)
        self.checkpoints = Checkpoints(self.state, self)
        self.stats = Stats(self.state, self)
        self.replication = Replication(self.state, self, faults=faults)
        self.upstream = Upstream(self.state, self)  # a regional shard's syncs with its global one (--upstream)
        self._draining = False
        self.state.history.start("backup" if cfg.backup_of else "primary", shard=cfg.shard, address=transport.address)
        self.replication.begin()  # epoch 0 on the witness, if the shard has one
        self.handlers = {
            MsgType.HELLO: self.membership.on_hello, MsgType.HEARTBEAT: self.membership.on_heartbeat,
            MsgType.LEAVE: self.membership.on_leave, MsgType.INIT: self.pushes.on_init,
            MsgType.PUSH: self.pushes.on_push, MsgType.PULL: self.pulls.on_pull,
            MsgType.PUSH_PULL: self.pulls.on_push_pull, MsgType.STATS: self.stats.on_stats,
            MsgType.SHUTDOWN: self.on_shutdown, MsgType.CHECKPOINT: self.checkpoints.on_checkpoint,
        }
        warm = Shard(1, cfg.optimizer, device=cfg.device)  # the optimizer's first step now, not at the first push
        warm.apply(torch.zeros(1, device=warm.device))
        if cfg.resume and cfg.checkpoint_dir:
            self.checkpoints.resume()

    # what tools and tests read most
    @property
    def shard(self) -> Shard | None:
        return self.state.shard

    @property
    def controller(self):
        return self.state.controller

    @property
    def transport(self) -> ServerTransport:
        return self.state.transport

    @property
    def cfg(self) -> ServerConfig:
        return self.state.cfg

    def summary(self) -> dict:
        return {**self.stats.summary(), **self.upstream.summary()}

    def state_dict(self) -> dict:
        return self.checkpoints.state_dict()

    def load_state_dict(self, state: dict, *, source: str = "state dict") -> None:
        self.checkpoints.load_state_dict(state, source=source)

    # --- the loop -----------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.state.stopped or not self.state.controller.active

    def serve(self, poll_interval: float = 0.1) -> dict:
        """Answer requests until every worker has left (or timed out); return the shard's summary.

        With cfg.checkpoint_dir a checkpoint is taken every cfg.checkpoint_every seconds, written by
        a thread while this loop answers requests (psrv/server/checkpoints/writer.py), and once more at the
        end (also when stopped by SIGTERM), waited for."""
        s, replication = self.state, self.replication
        replicas = replication.replicas
        log.info("shard %d/%d serving %s on %s", s.cfg.shard, s.cfg.num_shards, s.cfg.mode, s.transport.address)
        if s.cfg.witness:
            log.info("shard %d: %s", s.cfg.shard, replication.timing.line())
        while not self.finished:
            follower = replication.follower
            # a backup looks every 50 ms: it claims the shard within that of its bound
            item = s.transport.recv(poll_interval if follower is None else min(poll_interval, 0.05))
            if item is not None:
                self.handle(*item)
            follower = replication.follower
            if follower is not None:  # a backup: the primary's stream decides, until it falls silent
                if follower.refused:
                    raise ValueError(follower.refused)
                if follower.tick():
                    replication.try_take_over()
                continue
            self.membership.check_liveness()
            replicas.tick()
            self.checkpoints.tick()
            self.upstream.tick()
        if not s.stopped:  # its workers have left: a last sync, and the shard's weights are the global ones
            self.upstream.finish()
        if replicas.fenced:
            replication.linger_fenced()
        if replication.follower is None and not s.controller.active:
            replicas.finish()
        if s.cfg.checkpoint_dir and not replicas.fenced:  # a fenced primary's state is no longer the shard's
            final = self.checkpoints.save()
            if self.checkpoints.admin:
                self.checkpoints.answer_admin(at_exit=True, final=final)
        s.transport.wait_sent(5.0)
        summary = self.summary()
        replicas.close()
        if replication.follower is not None:
            replication.follower.close()
        return summary

    def stop(self) -> None:
        """End serving soon (Server.stop, a signal): a fenced primary ends its linger too."""
        self.state.stopped = True
        self.replication.replicas.linger_until = -float("inf")

    def handle(self, peer: Hashable, frames: list) -> None:
        """Handle one request; every request gets exactly one reply, now or deferred. With backups, a
        request that can change the shard is forwarded to them, and its replies wait for their acks
        (psrv/server/replication/primary.py); a backup holds a worker's request until it takes over."""
        replication = self.replication
        if stream.is_stream(frames):
            replication.on_stream(peer, frames)
            return
        if replication.follower is not None:
            if not replication.backup_stats(peer, frames):
                replication.follower.hold(peer, frames)
            return
        replicas = replication.replicas
        if replicas.awaiting(peer, frames):  # a primary waiting for the backups its RPC world holds
            return
        with replicas.deferring():
            msg = self._decode(peer, frames)
            if msg is not None:
                judged = self.state.judged = self._judge(msg) if msg.type in REPLICATED else None
                if msg.type in REPLICATED:
                    replicas.send("req", frames, peer=peer, judged=judged)
                try:
                    self.pushes.end_grace(judged)
                    self._serve(peer, msg, check=True)
                    self.drain()
                finally:
                    self.state.judged = None

    def _judge(self, msg: Message) -> dict:
        """What handling `msg` reads of time, judged once by the primary and sent with it in the stream, so its
        backups decide alike (a second process claiming a live rank is refused by both): how long the worker
        has been silent, and whether it was ever heard from."""
        liveness = self.state.liveness
        return {"silent": liveness.silent(msg.worker), "heard": msg.worker in liveness.last_seen,
                **self.pushes.grace.judged(msg)}

    def apply(self, peer: Hashable, frames: list, *, judged: dict | None = None) -> None:
        """Decode and serve one request its primary forwarded to this backup, with the primary's `judged`."""
        msg = self._decode(peer, frames)
        if msg is not None:
            self.state.judged = judged
            try:
                self.pushes.end_grace(judged)
                self._serve(peer, msg, check=True)
                self.drain()
            finally:
                self.state.judged = None
            self.pushes.held.keep()  # its payload is the primary's forward slot, written again once this loop moves on

    def pause(self, seconds: float) -> None:
        """Stop this loop for `seconds` (a nemesis's late ack, psrv/server/faults.py)."""
        log.warning("shard %d: stalled %.2fs on purpose (an injected fault)", self.state.cfg.shard, seconds)
        time.sleep(seconds)

    def _decode(self, peer: Hashable, frames: list) -> Message | None:
        """The request `frames` hold; None, with its ERROR reply made, when they hold none."""
        try:
            self.state.stats.received(sum(memoryview(f).nbytes for f in frames))
            msg = decode(frames)
            if self.state.cfg.first_rank and msg.worker >= 0:  # a region's shard: its ranks count from 0 here
                msg.worker -= self.state.cfg.first_rank
            return msg
        except Exception as exc:
            self.refuse(peer, 0, exc)
            return None

    def _serve(self, peer: Hashable, msg: Message, *, check: bool) -> None:
        """Check (on arrival) and handle one decoded request; a refusal becomes its ERROR reply. A push
        that must wait for another worker's half-applied chunked push is held (psrv/server/pushes/queued.py)."""
        try:
            handler = self.handlers.get(msg.type)
            if handler is None:
                raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{msg.type.name} is not a request")
            if msg.type in ADMIN and not getattr(self.state.transport, "authenticated", False):
                raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{msg.type.name} needs an authenticated peer: "
                                    "start the servers with --curve-keys (see docs/security.md)")
            if check and msg.type not in ANONYMOUS:
                self.membership.check_worker(msg)
            if msg.type in PUSHES and self.pushes.chunks.blocks(msg.worker):
                self.pushes.held.hold(peer, msg)
                return
            handler(peer, msg)
        except Exception as exc:
            self.refuse(peer, msg.seq, exc)

    def drain(self) -> None:
        """Handle the held pushes that no half-applied push blocks any more, in arrival order."""
        held, chunks = self.pushes.held, self.pushes.chunks
        while len(held) and not self._draining:
            item = held.next(chunks.blocks)
            if item is None:
                return
            self._draining = True
            try:
                self._serve(*item, check=False)
            finally:
                self._draining = False

    def refuse(self, peer: Hashable, seq: int, exc: Exception) -> None:
        """The ERROR reply to a request that failed: a peer's mistake (ProtocolError) or a bug of ours,
        which must not stop the loop either; the peer learns of it."""
        self.state.stats.errors += 1
        if isinstance(exc, ProtocolError):
            log.warning("shard %d: refused a request: %s", self.state.cfg.shard, exc)
            fields = {**exc.fields, "code": int(exc.code), "message": exc.message}
            if isinstance(exc, HelloAgain):
                fields["hello"] = True
        else:
            log.error("shard %d: internal error", self.state.cfg.shard, exc_info=exc)
            fields = {"code": int(ErrorCode.INTERNAL), "message": f"{type(exc).__name__}: {exc}"}
        self.reply(peer, Message(MsgType.ERROR, seq=seq, fields=fields))

    def on_shutdown(self, peer, msg: Message) -> None:
        self.state.stopped = True
        self.reply(peer, Message(MsgType.OK, seq=msg.seq))

    # --- replies ----------------------------------------------------------------
    def reply(self, peer, msg: Message, notes: list[tuple[str, dict]] | None = None) -> None:
        """Send a reply: at once, or once the backups hold what it acknowledges; a backup's go nowhere.
        `notes`: the history's events for it (a push acknowledged, a pull answered), recorded as it leaves."""
        if self.replication.follower is not None:
            return
        frames = encode(msg)
        self.state.stats.sent(sum(memoryview(f).nbytes for f in frames))
        if not self.replication.replicas.hold(peer, frames, notes):
            self.sent(peer, frames, notes)

    def sent(self, peer, frames: list, notes: list[tuple[str, dict]] | None) -> None:
        """A reply leaves now: its events are recorded first (docs/history.md)."""
        for ev, fields in notes or ():
            self.state.history.record(ev, **fields)
        self.state.transport.send(peer, frames)
