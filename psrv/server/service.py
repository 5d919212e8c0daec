"""The shard's event loop: decode -> consistency controller -> shard -> reply.

One thread owns the shard, so a read-modify-write of the parameters is never split.
Blocked pulls are kept as pending replies and answered when the controller allows. A push is
taken whole (psrv/server/push.py) or in chunks (psrv/server/chunked.py).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

import torch

from psrv.checkpoint import Checkpointer
from psrv.config import ServerConfig
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.server import onebit_adam, validate
from psrv.server.checkpointing import BackgroundCheckpoints
from psrv.server.chunked import ChunkedPushes, takes_chunks
from psrv.server.consistency import make_controller
from psrv.server.dedup import Dedup
from psrv.server.fragments import FragmentShards, fragment_key
from psrv.server.identity import Sessions
from psrv.server.late import LateStreaks
from psrv.server.joining import JoinWatch
from psrv.server.liveness import Liveness
from psrv.server.pending import Pending, PendingPulls
from psrv.server.persistence import AdminCheckpoints, ShardPersistence
from psrv.server.replicated import ShardReplication
from psrv.server.plans import Plans
from psrv.server.pulls import PullCopies
from psrv.server.push import commit_if_ready, take_push
from psrv.server.queued import HeldPushes
from psrv.server.follower import Follower
from psrv.server.replicas import REPLICATED, Replicas
from psrv.server import stream
from psrv.server.shard import Shard
from psrv.server.speeds import WorkerSpeeds
from psrv.server.stats import ShardStats
from psrv.server.validate import HelloAgain
from psrv.transport.base import ServerTransport

log = logging.getLogger("psrv.server")
ADMIN = (MsgType.SHUTDOWN, MsgType.CHECKPOINT)
ANONYMOUS = (MsgType.STATS, *ADMIN)             # no worker id needed
NEEDS_ACTIVE = (MsgType.INIT, MsgType.PUSH, MsgType.PULL, MsgType.PUSH_PULL)
PUSHES = (MsgType.PUSH, MsgType.PUSH_PULL)


class ShardService(ShardPersistence, ShardReplication):
    def __init__(self, cfg: ServerConfig, transport: ServerTransport, *, metrics=None,
                 now: Callable[[], float] = time.monotonic, join_timeout: float | None = None):
        """`join_timeout` (default cfg.join_timeout): seconds to wait for a worker never heard from."""
        self.cfg = cfg
        self.transport = transport
        self.metrics = metrics
        self.now = now
        self.controller = make_controller(cfg.mode, cfg.workers, staleness=cfg.staleness,
                                          backup_workers=cfg.backup_workers)
        self.stats = ShardStats(metrics=metrics)
        self.speeds = WorkerSpeeds()  # local_steps 'auto:H': the workers' seconds per inner step
        self.shard: Shard | None = None
        self.plan_hash: str | None = None
        self.plans = Plans()  # whose plan it is: rank 0's, a checkpoint's, or another rank's until rank 0's HELLO
        self.pending = PendingPulls()
        self.pulls = PullCopies(cfg.shard)  # the workers' copies under compressed pulls (psrv/server/pulls.py)
        self.dedup = Dedup()
        self.chunks = ChunkedPushes(self)  # pushes arriving chunk by chunk (psrv/server/chunked.py)
        self.held = HeldPushes()  # other workers' pushes while a chunked one is half applied
        self.fragments = FragmentShards()  # streaming DiLoCo's per-fragment outer optimizers
        self._draining = False
        join_timeout = cfg.join_timeout if join_timeout is None else join_timeout
        self.liveness = Liveness(timeout=cfg.worker_timeout, join_timeout=join_timeout, now=now)
        self.joins = JoinWatch(shard=cfg.shard)
        self.sessions = Sessions(shard=cfg.shard, timeout=cfg.worker_timeout)
        self.late = LateStreaks(shard=cfg.shard)
        self.resumed_from: int | None = None
        self.checkpoints = Checkpointer(cfg.checkpoint_dir, shard=cfg.shard, num_shards=cfg.num_shards,
                                        every=cfg.checkpoint_every, now=now)
        self.writer = BackgroundCheckpoints(self.checkpoints)  # periodic checkpoints, off this loop
        self.admin_checkpoints = AdminCheckpoints()  # CHECKPOINT requests waiting for their write
        self.stopped = False
        self._last_check = now()
        self.replicas = Replicas(self)  # this shard's backups while it is the primary (psrv/server/replicas.py)
        # a backup follows its primary's stream until it takes over (psrv/server/follower.py)
        self.follower = Follower(self, cfg.backup_of) if cfg.backup_of else None
        self.failovers: list[dict] = []  # when this backup took over
        self._handlers = {
            MsgType.HELLO: self._on_hello, MsgType.INIT: self._on_init, MsgType.PUSH: self._on_push,
            MsgType.PULL: self._on_pull, MsgType.PUSH_PULL: self._on_push_pull,
            MsgType.HEARTBEAT: self._on_heartbeat, MsgType.LEAVE: self._on_leave, MsgType.STATS: self._on_stats,
            MsgType.SHUTDOWN: self._on_shutdown, MsgType.CHECKPOINT: self._on_checkpoint,
        }
        warm = Shard(1, cfg.optimizer, device=cfg.device)  # the optimizer's first step now, not at the first push
        warm.apply(torch.zeros(1, device=warm.device))
        if cfg.resume and cfg.checkpoint_dir:
            saved = self.checkpoints.load()
            if saved is not None:
                self.load_state_dict(saved, source=str(self.checkpoints.path))

    # --- the loop -----------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.stopped or not self.controller.active

    def serve(self, poll_interval: float = 0.1) -> dict:
        """Answer requests until every worker has left (or timed out); return the shard's summary.

        With cfg.checkpoint_dir a checkpoint is taken every cfg.checkpoint_every seconds, written by
        a thread while this loop answers requests (psrv/server/checkpointing.py), and once more at the
        end (also when stopped by SIGTERM), waited for."""
        log.info("shard %d/%d serving %s on %s", self.cfg.shard, self.cfg.num_shards, self.cfg.mode,
                 self.transport.address)
        while not self.finished:
            item = self.transport.recv(poll_interval if self.follower is None else min(poll_interval, 0.05))
            if item is not None:
                self.handle(*item)
            if self.follower is not None:  # a backup: the primary's stream decides, until it falls silent
                if self.follower.tick():
                    self.take_over()
                continue
            self.check_liveness()
            self.replicas.tick()
            if self.admin_checkpoints:
                self.answer_admin_checkpoints()
            if self.checkpoints.due() and not self.writer.writing:
                self.start_checkpoint()
        if self.cfg.checkpoint_dir and not self.replicas.fenced:  # a fenced primary's state is no longer the shard's
            final = self.save_checkpoint()
            if self.admin_checkpoints:
                self.answer_admin_checkpoints(at_exit=True, final=final)
        self.transport.wait_sent(5.0)
        summary = self.summary()
        self.replicas.close()
        if self.follower is not None:
            self.follower.close()
        return summary

    def handle(self, peer: Hashable, frames: list) -> None:
        """Handle one request; every request gets exactly one reply, now or deferred. With backups, a
        request that can change the shard is forwarded to them, and its replies wait for their acks
        (psrv/server/replicas.py); a backup holds a worker's request until it takes over."""
        if stream.is_stream(frames):
            self.on_stream(peer, frames)
            return
        if self.follower is not None:
            if not self.backup_stats(peer, frames):
                self.follower.hold(peer, frames)
            return
        if self.replicas.awaiting(peer, frames):  # a primary waiting for the backups its RPC world holds
            return
        with self.replicas.deferring():
            msg = self._decode(peer, frames)
            if msg is not None:
                sent = self.replicas.send("req", frames, peer=peer) if msg.type in REPLICATED else None
                self._serve(peer, msg, check=True)
                self._drain()
                self.replicas.wait(sent)

    def apply(self, peer: Hashable, frames: list) -> None:
        """Decode and serve one request its primary forwarded to this backup."""
        msg = self._decode(peer, frames)
        if msg is not None:
            self._serve(peer, msg, check=True)
            self._drain()

    def _decode(self, peer: Hashable, frames: list) -> Message | None:
        """The request `frames` hold; None, with its ERROR reply made, when they hold none."""
        try:
            self.stats.received(sum(memoryview(f).nbytes for f in frames))
            return decode(frames)
        except Exception as exc:
            self._refuse(peer, 0, exc)
            return None

    def _serve(self, peer: Hashable, msg: Message, *, check: bool) -> None:
        """Check (on arrival) and handle one decoded request; a refusal becomes its ERROR reply. A push
        that must wait for another worker's half-applied chunked push is held (psrv/server/queued.py)."""
        try:
            handler = self._handlers.get(msg.type)
            if handler is None:
                raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{msg.type.name} is not a request")
            if msg.type in ADMIN and not getattr(self.transport, "authenticated", False):
                raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{msg.type.name} needs an authenticated peer: "
                                    "start the servers with --curve-keys (see docs/security.md)")
            if check and msg.type not in ANONYMOUS:
                self._check_worker(msg)
            if msg.type in PUSHES and self.chunks.blocks(msg.worker):
                self.held.hold(peer, msg)
                return
            handler(peer, msg)
        except Exception as exc:
            self._refuse(peer, msg.seq, exc)

    def _drain(self) -> None:
        """Handle the held pushes that no half-applied push blocks any more, in arrival order."""
        while len(self.held) and not self._draining:
            item = self.held.next(self.chunks.blocks)
            if item is None:
                return
            self._draining = True
            try:
                self._serve(*item, check=False)
            finally:
                self._draining = False

    def _refuse(self, peer: Hashable, seq: int, exc: Exception) -> None:
        """The ERROR reply to a request that failed: a peer's mistake (ProtocolError) or a bug of ours,
        which must not stop the loop either; the peer learns of it."""
        self.stats.errors += 1
        if isinstance(exc, ProtocolError):
            log.warning("shard %d: refused a request: %s", self.cfg.shard, exc)
            fields = {**exc.fields, "code": int(exc.code), "message": exc.message}
            if isinstance(exc, HelloAgain):
                fields["hello"] = True
        else:
            log.error("shard %d: internal error", self.cfg.shard, exc_info=exc)
            fields = {"code": int(ErrorCode.INTERNAL), "message": f"{type(exc).__name__}: {exc}"}
        self._reply(peer, Message(MsgType.ERROR, seq=seq, fields=fields))

    def check_liveness(self) -> None:
        """Workers silent for worker_timeout, or never heard from for join_timeout, leave the active set;
        barriers stop waiting for them. The ones not joined are named (psrv/server/joining.py)."""
        self.liveness.look()
        if self.now() - self._last_check < 0.05:
            return
        self._last_check = self.now()
        self.joins.look(self.liveness, self.controller.active)
        expired = self.liveness.expired(self.controller.active, self.pending.workers())
        if not expired:
            self._drain()
            return
        unheard = self.liveness.unheard(expired)
        with self.replicas.deferring():
            sent = self.replicas.send("expire", workers=expired, unheard=unheard)
            self.expire(expired, unheard)
            self.replicas.wait(sent)

    def expire(self, expired: list[int], unheard: list[int]) -> None:
        """Workers `expired` leave the active set for silence (`unheard`: never joined); a backup does it
        when its primary's stream says so."""
        if unheard:
            self.joins.gave_up(unheard, self.liveness, others=bool(set(self.controller.active) - set(expired)))
        for w in expired:
            if w not in unheard:
                log.warning("shard %d: worker %d silent for %.1fs, removed from the active set",
                            self.cfg.shard, w, self.liveness.silent(w))
            self.stats.lost_workers.append(w)
            self.liveness.lost.add(w)
            self._remove(w)
        self._drain()

    # --- handlers -------------------------------------------------------------
    def _on_hello(self, peer, msg: Message) -> None:
        _, size = validate.hello(self.cfg, msg)
        model = validate.model(msg)
        pull_copy = self.pulls.check(msg.worker, msg.fields.get("pull"), size)  # compressed pulls' settings
        heard = msg.worker in self.liveness.last_seen
        try:  # rank 0's plan is the shard's; another rank's model is refused by its rank (psrv/server/plans.py)
            settled = self.plans.hello(msg.worker, model, heard=heard,
                                       initialised=self.shard is not None and self.shard.initialised)
        except ProtocolError:
            if not heard:  # never joined: no barrier waits for it to
                self._drop_misfit(msg.worker)
            raise
        if settled.build:  # the first HELLO, or rank 0's with another plan than the one the empty shard was built on
            # shared memory: sent by place. Shared from an untouched buffer, which costs no resident memory
            weights = self.transport.share(torch.empty(size, dtype=torch.float32, device=self.cfg.device))
            self.shard = Shard(size, self.cfg.optimizer, device=self.cfg.device, weights=weights)
        self.plan_hash = self.plans.hash
        for worker, refusal in settled.expelled.items():  # welcomed on another plan than rank 0's: refused now
            for pending in [p for p in self.pending if p.worker == worker]:
                for waiting in pending.peers:
                    self._refuse(waiting, pending.seq, refusal)
            self.pending.drop(worker)
            self._drop_misfit(worker)
        self._claim(msg)
        self.pulls.greet(msg.worker, pull_copy)  # whatever copy it held is forgotten: its next pull is dense
        self.pending.drop(msg.worker)  # a restarted worker's old pulls
        self.chunks.forget(msg.worker)  # and its half-sent push
        self.held.drop(msg.worker)  # and the pushes it sent while another push was half applied
        if msg.worker in self.liveness.left or msg.worker not in self.controller.active:
            if msg.worker in self.liveness.lost:
                log.info("shard %d: worker %d rejoined", self.cfg.shard, msg.worker)
            self.liveness.rejoined(msg.worker)
            self.controller.join(msg.worker)
            self.stats.membership(self.controller.active, {})
        self._reply(peer, Message(MsgType.WELCOME, seq=msg.seq, fields={
            "shard": self.cfg.shard, "mode": self.cfg.mode, "staleness": self.cfg.staleness,
            "version": self.shard.version, "clock": self.controller.next_clock(msg.worker),
            "initialised": self.shard.initialised, "size": self.shard.size,
            "last_seq": self.dedup.last_seq(msg.worker), "worker_timeout": self.cfg.worker_timeout,
            "clip_grad_norm": self.cfg.optimizer.clip_grad_norm, "onebit": onebit_adam.welcome(self.cfg.optimizer),
            "optimizer": validate.optimizer_welcome(self.cfg.optimizer),
            "chunks": takes_chunks(self.cfg), "replicas": self.replicas.addresses, "epoch": self.replicas.epoch}))

    def _on_init(self, peer, msg: Message) -> None:
        if "chunk" in msg.fields:  # psrv/server/chunked.py
            fields = self.chunks.take_init(msg)
            if fields is not None:
                self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields=fields))
                self._release()
            return
        shard = self.ready_shard(msg, need_init=False)
        values = validate.tensor(msg, shard.size)
        already = shard.initialised
        if not already:
            if not validate.is_finite(values):
                raise ProtocolError(ErrorCode.NONFINITE, "initial weights have NaN or Inf; refused")
            shard.init(values)
        self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields={"already": already}))
        self._release()

    def _on_push(self, peer, msg: Message) -> None:
        self.speeds.report(msg.worker, msg.fields)
        pushed = self._push_or_chunk(msg)
        if pushed is None:  # a chunk, not the push's last: the push is answered once, at its end
            return
        info = {**pushed, **self.speeds.fastest(self.controller.active)}
        self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields=info))
        self._release()

    def _on_pull(self, peer, msg: Message, push: dict | None = None, clock: int | None = None) -> None:
        shard = self.ready_shard(msg, need_init=False)
        self.pulls.expect(msg)
        final = bool(msg.fields.get("final"))
        fragment = fragment_key(msg, shard.size)
        self.pending.add(peer, worker=msg.worker, seq=msg.seq, clock=msg.clock if clock is None else clock,
                         final=final, received=self.now(), push=push, view=msg.fields.get("view", 0),
                         fragment=fragment)
        if final:  # it pushes no more: a rejoined worker still behind must not wait for it
            self.controller.finish(msg.worker)
            commit_if_ready(self)
        self._release()

    def _on_push_pull(self, peer, msg: Message) -> None:
        self.pulls.expect(msg)  # before the push: a re-sent one after the HELLO is applied once
        self.speeds.report(msg.worker, msg.fields)
        pushed = self._push_or_chunk(msg)
        if pushed is None:  # a chunk, not the push's last: its pull is registered with the last
            return
        info = {**pushed, **self.speeds.fastest(self.controller.active)}
        self._on_pull(peer, msg, push=info, clock=msg.clock + 1)

    def _on_heartbeat(self, peer, msg: Message) -> None:
        """A beat from the worker's heartbeat thread, or a client's probe: do we still hold its
        request `probe` (a deferred pull)? If not, the client re-sends it."""
        fields = {"active": msg.worker in self.controller.active}
        probe = msg.fields.get("probe")
        if probe is None:
            self.liveness.seen(msg.worker, heartbeat=True)
        else:
            fields.update(probe=probe, holding=self.pending.holding(msg.worker, probe)
                          or self.held.holding(msg.worker, probe))
        self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields=fields))

    def _on_leave(self, peer, msg: Message) -> None:
        self.liveness.left.add(msg.worker)
        self._remove(msg.worker)
        self._reply(peer, Message(MsgType.OK, seq=msg.seq))

    def _on_stats(self, peer, msg: Message) -> None:
        self._reply(peer, Message(MsgType.STATS, seq=msg.seq, fields=self.summary()))

    def _on_shutdown(self, peer, msg: Message) -> None:
        self.stopped = True
        self._reply(peer, Message(MsgType.OK, seq=msg.seq))

    def _on_checkpoint(self, peer, msg: Message) -> None:
        if not self.cfg.checkpoint_dir:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, "this server has no --checkpoint-dir")
        if self.shard is None or not self.shard.initialised:  # nothing to write yet: said at once
            self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields={"path": None, "version": 0}))
            return
        self.admin_checkpoints.asked.append((peer, msg.seq))  # written off this loop, answered when done
        self.answer_admin_checkpoints()

    # --- mechanics ------------------------------------------------------------
    def _push_or_chunk(self, msg: Message) -> dict | None:
        """A whole push's answer; a chunk's (psrv/server/chunked.py) once its push is whole, else None."""
        return self.chunks.take(msg) if "chunk" in msg.fields else take_push(self, msg)

    def record_answer(self, msg: Message, info: dict) -> dict:
        """`info`, push `msg`'s answer, recorded so a re-send of it is answered alike (psrv/server/dedup.py)."""
        self.dedup.record(msg.worker, msg.seq, info)
        return info

    def _remove(self, worker: int) -> None:
        self.chunks.forget(worker)
        self.pulls.forget(worker)
        self.held.drop(worker)
        self.controller.leave(worker)
        self.speeds.forget(worker)
        self.stats.membership(self.controller.active, {})
        self.stats.departed(worker)
        self.pending.drop(worker)
        commit_if_ready(self)
        self._release()

    def _drop_misfit(self, worker: int) -> None:
        """A worker refused for its model leaves the active set, as with LEAVE, so no barrier waits for it;
        unless it is the last one there, whose leaving would end the shard."""
        if self.controller.active - {worker}:
            self._remove(worker)

    def _release(self) -> None:
        """Answer every pending pull the controller now allows."""
        if self.shard is not None and self.shard.initialised and not self.chunks.applying:  # none half applied
            self.pending.release(self._ready, self._answer)

    def _ready(self, p: Pending) -> bool:
        ready = self.controller.pull_ready(p.worker, p.clock)
        return ready and (not p.final or self.controller.active <= {p.worker})

    def _answer(self, p: Pending) -> None:
        gap = self.controller.clock_gap(p.clock)
        waited = self.now() - p.received
        self.stats.answered(waited=waited, gap=gap)
        # the weights, or under compressed pulls their change since the worker's copy: the version it brings it to
        if p.fragment is None:
            extra, tensor, parts, held = self.pulls.answer(p.worker, self.shard.weights, have=p.view, final=p.final)
            if self.cfg.mode != "sync":  # a sync clock's mean has no one worker's pulled weights
                self.shard.pulled(p.worker, held)
        else:  # streaming DiLoCo: that fragment's weights, or their change since the worker's copy of them
            extra, tensor, parts = self.pulls.answer_fragment(p.worker, self.shard.weights, p.fragment,
                                                              have=p.view, final=p.final)
        fields = {"version": self.shard.version, "clock": self.controller.next_clock(p.worker),
                  "waited": waited, "gap": gap, **extra}
        if p.push is not None:
            fields["push"] = p.push
        for peer in p.peers:
            self._reply(peer, Message(MsgType.WEIGHTS, seq=p.seq, fields=fields, tensor=tensor, parts=parts))

    def before_write(self) -> None:
        """Called right before the weights are written (psrv/server/push.py, chunked.py): what still views
        them, replies on the wire or held for the backups' acks, is sent or copied first."""
        self.replicas.protect()
        self.transport.wait_sent()

    def _reply(self, peer, msg: Message) -> None:
        """Send a reply: at once, or once the backups hold what it acknowledges; a backup's go nowhere."""
        if self.follower is not None:
            return
        frames = encode(msg)
        self.stats.sent(sum(memoryview(f).nbytes for f in frames))
        if not self.replicas.hold(peer, frames):
            self.transport.send(peer, frames)

    def _check_worker(self, msg: Message) -> None:
        if not 0 <= msg.worker < self.cfg.workers:
            raise ProtocolError(ErrorCode.NOT_ALLOWED,
                                f"worker id {msg.worker} outside [0, {self.cfg.workers}) (--workers)")
        if msg.type in NEEDS_ACTIVE and msg.worker in self.plans.refused:  # another model than rank 0's
            raise self.plans.refused[msg.worker]
        if msg.type is not MsgType.HELLO:  # a HELLO claims its rank once its plan is checked (_on_hello)
            self._claim(msg)
        if msg.type in NEEDS_ACTIVE:
            self.dedup.note(msg.worker, msg.seq)
        if msg.type in NEEDS_ACTIVE and self.shard is not None and msg.worker not in self.controller.active:
            why = "left" if msg.worker in self.liveness.left else "was dropped after silence"
            raise HelloAgain(f"worker {msg.worker} {why}; send HELLO to rejoin")

    def _claim(self, msg: Message) -> None:
        """msg's process holds its rank (RANK_IN_USE while another live one does); heard from now."""
        self.sessions.check(msg, active=msg.worker in self.controller.active, silent=self.liveness.silent(msg.worker))
        self.liveness.seen(msg.worker)

    def ready_shard(self, msg: Message, *, need_init: bool) -> Shard:
        """The shard `msg` may touch: HelloAgain before any HELLO, NOT_ALLOWED before INIT where it needs weights."""
        if self.shard is None:
            raise HelloAgain(f"{msg.type.name} before any HELLO")
        if need_init and not self.shard.initialised:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{msg.type.name} before INIT (rank 0 sends it)")
        return self.shard

    def summary(self) -> dict:
        return {"shard": self.cfg.shard, "num_shards": self.cfg.num_shards, "mode": self.cfg.mode,
                "update_rule": self.cfg.optimizer.update_rule,
                "staleness": self.cfg.staleness, "workers": self.cfg.workers,
                "version": self.shard.version if self.shard else 0, "plan_hash": self.plan_hash,
                "active": sorted(self.controller.active),
                "clocks": {str(w): c for w, c in self.controller.clocks.items()},
                "resumed_from": self.resumed_from, "lost_clocks": self.controller.skipped,
                "checkpoints": self.checkpoints.count, "checkpoint_version": self.checkpoints.version,
                "checkpoint_seconds": self.checkpoints.seconds, "checkpoint_writing": self.writer.writing,
                "payload_bytes": dict(getattr(self.transport, "payload_bytes", {})),  # by data path
                "role": "backup" if self.follower is not None else "primary",
                "epoch": self.follower.epoch if self.follower is not None else self.replicas.epoch,
                "address": getattr(self.transport, "address", None),
                "backups": [b.address for b in self.replicas.backups], "failovers": self.failovers,
                "fenced": self.replicas.fenced,
                **self.stats.to_dict()}
