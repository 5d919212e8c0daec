"""The shard's event loop: decode -> consistency controller -> shard -> reply.

One thread owns the shard, so a read-modify-write of the parameters is never split.
Blocked pulls are kept as pending replies and answered when the controller allows. A push is
taken whole (psrv/server/push.py) or in chunks (psrv/server/chunked.py). Its parts, mixins of ShardService:
who works with the shard (psrv/server/membership.py), how pulls are answered (psrv/server/pull_answers.py),
its state and checkpoints (psrv/server/persistence.py) and its replication (psrv/server/replication/).
Every push it applies, acknowledges or answers is recorded in its history (psrv/history.py, docs/history.md).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

import torch

from psrv.checkpoint import Checkpointer
from psrv.config import ServerConfig
from psrv.history import History
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.server import validate
from psrv.server.checkpointing import BackgroundCheckpoints
from psrv.server.chunked import ChunkedPushes
from psrv.server.consistency import make_controller
from psrv.server.dedup import Dedup
from psrv.server.fragments import FragmentShards
from psrv.server.identity import Sessions
from psrv.server.late import LateStreaks
from psrv.server.joining import JoinWatch
from psrv.server.liveness import Liveness
from psrv.server.membership import ShardMembership
from psrv.server.pending import PendingPulls
from psrv.server.persistence import AdminCheckpoints, ShardPersistence
from psrv.server.replication.service import ShardReplication
from psrv.server.plans import Plans
from psrv.server.pull_answers import PullAnswers
from psrv.server.pulls import PullCopies
from psrv.server.push import take_push
from psrv.server.queued import HeldPushes
from psrv.server.faults import InjectedFaults
from psrv.server.replica_state import ReplicaState
from psrv.server.replication.follower import Follower
from psrv.server.replication.primary import REPLICATED, Replicas
from psrv.server.replication import stream
from psrv.server.shard import Shard
from psrv.server.speeds import WorkerSpeeds
from psrv.server.stats import ShardStats
from psrv.server.validate import HelloAgain
from psrv.transport.base import ServerTransport

log = logging.getLogger("psrv.server")
ADMIN = (MsgType.SHUTDOWN, MsgType.CHECKPOINT)
ANONYMOUS = (MsgType.STATS, *ADMIN)             # no worker id needed
PUSHES = (MsgType.PUSH, MsgType.PUSH_PULL)


class ShardService(ShardMembership, PullAnswers, ShardPersistence, ShardReplication, ReplicaState):
    def __init__(self, cfg: ServerConfig, transport: ServerTransport, *, metrics=None,
                 now: Callable[[], float] = time.monotonic, join_timeout: float | None = None,
                 history: History | None = None, faults: InjectedFaults | None = None):
        """`join_timeout` (default cfg.join_timeout): seconds to wait for a worker never heard from.
        `history`: where its events go (docs/history.md; default nowhere); `faults`: a nemesis's injected
        faults it obeys (psrv/server/faults.py; default none)."""
        self.cfg = cfg
        self.transport = transport
        self.metrics = metrics
        self.now = now
        self.history = history or History.off()
        self.faults = faults
        self.timing = cfg.timeouts(transport.silence_tolerance)  # failover timeouts (psrv/timeouts.py)
        self.judged: dict | None = None  # the primary's judgement of time for the request in hand (handle)
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
        # this shard's backups while it is the primary; a backup follows its primary's stream until it takes
        # over (psrv/server/replication/)
        self.replicas = Replicas(self)
        self.follower = Follower(self, cfg.backup_of) if cfg.backup_of else None
        self.failovers: list[dict] = []  # when this backup took over
        self.history.start("backup" if cfg.backup_of else "primary", shard=cfg.shard, address=transport.address)
        if self.follower is None:
            self.replicas.begin()  # epoch 0 on the witness, if the shard has one
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
        if self.cfg.witness:
            log.info("shard %d: %s", self.cfg.shard, self.timing.line())
        while not self.finished:
            item = self.transport.recv(poll_interval if self.follower is None else
                                       min(poll_interval, 0.05, self.follower.due()))
            if item is not None:
                self.handle(*item)
            if self.follower is not None:  # a backup: the primary's stream decides, until it falls silent
                if self.follower.refused:
                    raise ValueError(self.follower.refused)
                if self.follower.tick():
                    self.try_take_over()
                continue
            self.check_liveness()
            self.replicas.tick()
            if self.admin_checkpoints:
                self.answer_admin_checkpoints()
            if self.checkpoints.due() and not self.writer.writing:
                self.start_checkpoint()
        if self.replicas.fenced:
            self.linger_fenced()
        if self.follower is None and not self.controller.active:
            self.replicas.finish()
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

    def stop(self) -> None:
        """End serving soon (Server.stop, a signal): a fenced primary ends its linger too."""
        self.stopped = True
        self.replicas.linger_until = -float("inf")

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
                self.judged = self._judge(msg) if msg.type in REPLICATED else None
                if msg.type in REPLICATED:
                    self.replicas.send("req", frames, peer=peer, judged=self.judged)
                try:
                    self._serve(peer, msg, check=True)
                    self._drain()
                finally:
                    self.judged = None

    def _judge(self, msg: Message) -> dict:
        """What handling `msg` reads of time, judged once by the primary and sent with it in the stream, so its
        backups decide alike (a second process claiming a live rank is refused by both): how long the worker
        has been silent, and whether it was ever heard from."""
        return {"silent": self.liveness.silent(msg.worker), "heard": msg.worker in self.liveness.last_seen}

    def apply(self, peer: Hashable, frames: list, *, judged: dict | None = None) -> None:
        """Decode and serve one request its primary forwarded to this backup, with the primary's `judged`."""
        msg = self._decode(peer, frames)
        if msg is not None:
            self.judged = judged
            try:
                self._serve(peer, msg, check=True)
                self._drain()
            finally:
                self.judged = None
            self.held.keep()  # its payload is the primary's forward slot, written again once this loop moves on

    def pause(self, seconds: float) -> None:
        """Stop this loop for `seconds` (a nemesis's late ack, psrv/server/faults.py)."""
        log.warning("shard %d: stalled %.2fs on purpose (an injected fault)", self.cfg.shard, seconds)
        time.sleep(seconds)

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

    # --- handlers -------------------------------------------------------------
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
        info = {**pushed, **self.speeds.fastest(self.controller.active), **self.replicas.said()}
        self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields=info), [self.acked(msg, info)])
        self._release()

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

    def record_answer(self, msg: Message, info: dict, *, recorded: bool = False) -> dict:
        """`info`, push `msg`'s answer, recorded so a re-send of it is answered alike (psrv/server/dedup.py),
        and in the history as applied or dropped unless `recorded` already (docs/history.md)."""
        self.dedup.record(msg.worker, msg.seq, info)
        if not recorded:
            self.took(msg, why=info.get("dropped") or ("invalid" if "refused" in info else None),
                      version=info.get("version"))
        return info

    def took(self, msg: Message, *, why: str | None = None, version: int | None = None) -> None:
        """Push `msg` in the history: applied (sync: into its clock's sum), or dropped for `why`."""
        where = {"w": msg.worker, "seq": msg.seq, "clock": msg.clock, "epoch": self.epoch}
        if why:
            self.history.record("drop", **where, why=why)
        else:
            self.history.record("apply", **where, version=version)

    @property
    def epoch(self) -> int:
        """The epoch this replica serves or follows (0 without replication)."""
        return self.follower.epoch if self.follower is not None else self.replicas.epoch

    def before_write(self) -> None:
        """Called right before the weights are written (psrv/server/push.py, chunked.py): what still views
        them, replies on the wire or held for the backups' acks, is sent or copied first."""
        self.replicas.protect()
        self.transport.wait_sent()

    def _reply(self, peer, msg: Message, notes: list[tuple[str, dict]] | None = None) -> None:
        """Send a reply: at once, or once the backups hold what it acknowledges; a backup's go nowhere.
        `notes`: the history's events for it (a push acknowledged, a pull answered), recorded as it leaves."""
        if self.follower is not None:
            return
        frames = encode(msg)
        self.stats.sent(sum(memoryview(f).nbytes for f in frames))
        if not self.replicas.hold(peer, frames, notes):
            self.sent(peer, frames, notes)

    def sent(self, peer, frames: list, notes: list[tuple[str, dict]] | None) -> None:
        """A reply leaves now: its events are recorded first (docs/history.md)."""
        for ev, fields in notes or ():
            self.history.record(ev, **fields)
        self.transport.send(peer, frames)

    def acked(self, msg: Message, info: dict) -> tuple[str, dict]:
        """The history's event for push `msg` acknowledged with `info` (its answer)."""
        return ("ack", {"w": msg.worker, "seq": msg.seq, "epoch": self.replicas.epoch,
                        "version": info.get("version"), "dropped": info.get("dropped")})

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
                "epoch": self.epoch,
                "address": getattr(self.transport, "address", None),
                "backups": [b.address for b in self.replicas.backups], "failovers": self.failovers,
                "fenced": self.replicas.fenced,
                **self.stats.to_dict()}
