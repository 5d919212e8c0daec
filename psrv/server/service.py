"""The shard's event loop: decode -> consistency controller -> shard -> reply.

One thread owns the shard, so a read-modify-write of the parameters is never split.
Blocked pulls are kept as pending replies and answered when the controller allows.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from psrv.config import ServerConfig
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.server.consistency import Decision, make_controller
from psrv.server.partition import shard_range
from psrv.server.shard import Shard
from psrv.server.stats import ShardStats
from psrv.transport.base import ServerTransport

log = logging.getLogger("psrv.server")
WIRE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class _Pending:
    peer: Hashable
    worker: int
    seq: int
    clock: int
    final: bool
    received: float
    push: dict | None  # the push half of a PUSH_PULL, for the reply


class ShardService:
    def __init__(self, cfg: ServerConfig, transport: ServerTransport, *, metrics=None,
                 now: Callable[[], float] = time.monotonic, join_timeout: float = 120.0):
        self.cfg = cfg
        self.transport = transport
        self.metrics = metrics
        self.now = now
        self.join_timeout = join_timeout
        self.controller = make_controller(cfg.mode, cfg.workers, staleness=cfg.staleness,
                                          backup_workers=cfg.backup_workers)
        self.stats = ShardStats(metrics=metrics)
        self.shard: Shard | None = None
        self.plan_hash: str | None = None
        self.pending: list[_Pending] = []
        self.last_seq: dict[int, int] = {}
        self.last_seen: dict[int, float] = {}
        self.left: set[int] = set()
        self.started = now()
        self.stopped = False
        self._handlers = {
            MsgType.HELLO: self._on_hello, MsgType.INIT: self._on_init, MsgType.PUSH: self._on_push,
            MsgType.PULL: self._on_pull, MsgType.PUSH_PULL: self._on_push_pull,
            MsgType.HEARTBEAT: self._on_heartbeat, MsgType.LEAVE: self._on_leave,
            MsgType.STATS: self._on_stats, MsgType.SHUTDOWN: self._on_shutdown,
        }

    # --- the loop -----------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.stopped or not self.controller.active

    def serve(self, poll_interval: float = 0.1) -> dict:
        """Answer requests until every worker has left (or timed out); return the shard's summary."""
        log.info("shard %d/%d serving %s on %s", self.cfg.shard, self.cfg.num_shards, self.cfg.mode,
                 self.transport.address)
        while not self.finished:
            item = self.transport.recv(poll_interval)
            if item is not None:
                self.handle(*item)
            self.check_liveness()
        self.transport.wait_sent(5.0)
        return self.summary()

    def handle(self, peer: Hashable, frames: list) -> None:
        """Handle one request; every request gets exactly one reply, now or deferred."""
        seq = 0
        try:
            self.stats.received(sum(memoryview(f).nbytes for f in frames))
            msg = decode(frames)
            seq = msg.seq
            handler = self._handlers.get(msg.type)
            if handler is None:
                raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{msg.type.name} is not a request")
            if msg.type not in (MsgType.STATS, MsgType.SHUTDOWN):
                self._check_worker(msg)
            handler(peer, msg)
        except ProtocolError as exc:
            self.stats.errors += 1
            log.warning("shard %d: refused a request: %s", self.cfg.shard, exc)
            self._reply(peer, Message(MsgType.ERROR, seq=seq,
                                      fields={"code": int(exc.code), "message": exc.message}))
        except Exception as exc:  # a bug must not stop the loop; the peer learns of it
            self.stats.errors += 1
            log.exception("shard %d: internal error", self.cfg.shard)
            self._reply(peer, Message(MsgType.ERROR, seq=seq, fields={
                "code": int(ErrorCode.INTERNAL), "message": f"{type(exc).__name__}: {exc}"}))

    def check_liveness(self) -> None:
        """Workers silent for worker_timeout (with no request waiting on us) leave the active set."""
        now = self.now()
        waiting = {p.worker for p in self.pending}
        for w in sorted(self.controller.active - waiting):
            seen = self.last_seen.get(w)
            limit = self.cfg.worker_timeout if seen is not None else self.join_timeout
            if now - (seen if seen is not None else self.started) > limit:
                log.warning("shard %d: worker %d silent for %.1fs, removed from the active set",
                            self.cfg.shard, w, now - (seen or self.started))
                self.stats.lost_workers.append(w)
                self._remove(w)

    # --- handlers -------------------------------------------------------------
    def _on_hello(self, peer, msg: Message) -> None:
        f = msg.fields
        if f.get("num_shards") != self.cfg.num_shards or f.get("shard") != self.cfg.shard:
            raise ProtocolError(ErrorCode.PLAN_MISMATCH,
                                f"worker addressed shard {f.get('shard')!r} of {f.get('num_shards')!r}; "
                                f"this is shard {self.cfg.shard} of {self.cfg.num_shards} (check --servers order)")
        if f.get("world_size") != self.cfg.workers:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"worker says world size {f.get('world_size')!r}; "
                                f"this server was started with --workers {self.cfg.workers}")
        plan_hash, total = f.get("plan_hash"), f.get("total")
        if not isinstance(plan_hash, str) or not isinstance(total, int) or total < self.cfg.num_shards:
            raise ProtocolError(ErrorCode.MALFORMED, "HELLO needs plan_hash (str) and total (int)")
        if self.plan_hash is None:
            lo, hi = shard_range(total, self.cfg.num_shards, self.cfg.shard)
            self.shard = Shard(hi - lo, self.cfg.optim, device=self.cfg.device)
            self.plan_hash = plan_hash
        elif plan_hash != self.plan_hash:
            raise ProtocolError(ErrorCode.PLAN_MISMATCH, f"worker {msg.worker}'s partition plan {plan_hash} "
                                f"differs from this server's {self.plan_hash}: another model or shard count")
        if msg.worker in self.left or msg.worker not in self.controller.active:
            self.left.discard(msg.worker)
            self.controller.join(msg.worker)
        self._reply(peer, Message(MsgType.WELCOME, seq=msg.seq, fields={
            "shard": self.cfg.shard, "mode": self.cfg.mode, "staleness": self.cfg.staleness,
            "version": self.shard.version, "clock": self.controller.next_clock(msg.worker),
            "initialised": self.shard.initialised, "size": self.shard.size}))

    def _on_init(self, peer, msg: Message) -> None:
        shard = self._ready_shard(msg, need_init=False)
        values = self._tensor(msg, shard)
        already = shard.initialised
        if not already:
            shard.init(values)
        self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields={"already": already}))
        self._release()

    def _on_push(self, peer, msg: Message) -> None:
        info = self._push(msg)
        self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields=info))
        self._release()

    def _on_pull(self, peer, msg: Message, push: dict | None = None, clock: int | None = None) -> None:
        self._ready_shard(msg, need_init=False)
        self.pending.append(_Pending(peer, msg.worker, msg.seq, msg.clock if clock is None else clock,
                                     bool(msg.fields.get("final")), self.now(), push))
        self._release()

    def _on_push_pull(self, peer, msg: Message) -> None:
        info = self._push(msg)
        self._on_pull(peer, msg, push=info, clock=msg.clock + 1)

    def _on_heartbeat(self, peer, msg: Message) -> None:
        self._reply(peer, Message(MsgType.OK, seq=msg.seq))

    def _on_leave(self, peer, msg: Message) -> None:
        self.left.add(msg.worker)
        self._remove(msg.worker)
        self._reply(peer, Message(MsgType.OK, seq=msg.seq))

    def _on_stats(self, peer, msg: Message) -> None:
        self._reply(peer, Message(MsgType.STATS, seq=msg.seq, fields=self.summary()))

    def _on_shutdown(self, peer, msg: Message) -> None:
        self.stopped = True
        self._reply(peer, Message(MsgType.OK, seq=msg.seq))

    # --- mechanics ------------------------------------------------------------
    def _push(self, msg: Message) -> dict:
        """Accept one gradient: dedup, validate, then apply / accumulate / drop as the controller says."""
        started = time.perf_counter()
        shard = self._ready_shard(msg, need_init=True)
        grad = self._tensor(msg, shard)
        if msg.seq <= self.last_seq.get(msg.worker, 0):
            self.stats.duplicates += 1
            return {"version": shard.version, "duplicate": True, "staleness": 0}
        finite = bool(torch.isfinite(grad.sum()))  # one pass; NaN/Inf anywhere makes the sum non-finite
        if not finite and self.cfg.nonfinite == "reject":
            self.stats.drop("invalid")
            raise ProtocolError(ErrorCode.NONFINITE, "gradient has NaN or Inf; refused (see --nonfinite)")
        self.last_seq[msg.worker] = msg.seq
        if not finite:  # --nonfinite skip: acknowledged, never applied
            self.stats.drop("invalid")
            self.stats.pushed(time.perf_counter() - started, None)
            return {"version": shard.version, "dropped": "nonfinite", "staleness": 0}
        decision = self.controller.push(msg.worker, msg.clock)
        if decision is Decision.DROP:
            self.stats.drop("late")
            self.stats.pushed(time.perf_counter() - started, None)
            return {"version": shard.version, "dropped": "late", "staleness": 0}
        staleness = shard.version - msg.base_version
        self.transport.wait_sent()  # replies still reading the weights must leave before we write them
        if decision is Decision.APPLY:
            shard.apply(grad)
            self.stats.applied(shard.version)
        else:
            shard.accumulate(grad)
            self._commit_if_ready()
        self.stats.pushed(time.perf_counter() - started, staleness)
        self.stats.membership(self.controller.active, {msg.worker: self.controller.clocks[msg.worker]})
        return {"version": shard.version, "staleness": staleness}

    def _commit_if_ready(self) -> None:
        if self.shard is not None and self.controller.commit_ready():
            self.transport.wait_sent()
            self.shard.apply_accumulated()
            self.controller.committed()
            self.stats.applied(self.shard.version)

    def _remove(self, worker: int) -> None:
        self.controller.leave(worker)
        self.stats.membership(self.controller.active, {})
        self.pending = [p for p in self.pending if p.worker != worker]
        self._commit_if_ready()
        self._release()

    def _release(self) -> None:
        """Answer every pending pull the controller now allows."""
        if self.shard is None or not self.shard.initialised:
            return
        still = []
        for p in self.pending:
            ready = self.controller.pull_ready(p.worker, p.clock)
            if p.final:
                ready = ready and self.controller.active <= {p.worker}
            if ready:
                self._answer(p)
            else:
                still.append(p)
        self.pending = still

    def _answer(self, p: _Pending) -> None:
        gap = self.controller.clock_gap(p.clock)
        waited = self.now() - p.received
        self.stats.answered(waited=waited, gap=gap)
        fields = {"version": self.shard.version, "clock": self.controller.next_clock(p.worker),
                  "waited": waited, "gap": gap}
        if p.push is not None:
            fields["push"] = p.push
        self._reply(p.peer, Message(MsgType.WEIGHTS, seq=p.seq, fields=fields, tensor=self.shard.weights))

    def _reply(self, peer, msg: Message) -> None:
        frames = encode(msg)
        self.stats.sent(sum(memoryview(f).nbytes for f in frames))
        self.transport.send(peer, frames)

    def _check_worker(self, msg: Message) -> None:
        if not 0 <= msg.worker < self.cfg.workers:
            raise ProtocolError(ErrorCode.NOT_ALLOWED,
                                f"worker id {msg.worker} outside [0, {self.cfg.workers}) (--workers)")
        self.last_seen[msg.worker] = self.now()

    def _ready_shard(self, msg: Message, *, need_init: bool) -> Shard:
        if self.shard is None:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{msg.type.name} before any HELLO")
        if need_init and not self.shard.initialised:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{msg.type.name} before INIT (rank 0 sends it)")
        return self.shard

    def _tensor(self, msg: Message, shard: Shard) -> torch.Tensor:
        t = msg.tensor
        if t is None:
            raise ProtocolError(ErrorCode.BAD_TENSOR, f"{msg.type.name} needs a tensor frame")
        if t.dtype not in WIRE_DTYPES or t.numel() != shard.size:
            raise ProtocolError(ErrorCode.BAD_TENSOR, f"expected {shard.size} float32 values for this shard, "
                                f"got {t.numel()} {str(t.dtype).removeprefix('torch.')}")
        return t

    def summary(self) -> dict:
        return {"shard": self.cfg.shard, "num_shards": self.cfg.num_shards, "mode": self.cfg.mode,
                "staleness": self.cfg.staleness, "workers": self.cfg.workers,
                "version": self.shard.version if self.shard else 0, "plan_hash": self.plan_hash,
                "active": sorted(self.controller.active),
                "clocks": {str(w): c for w, c in self.controller.clocks.items()},
                **self.stats.to_dict()}
