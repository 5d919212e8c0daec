"""Who works with a shard: a worker's HELLO (its plan checked against rank 0's, its rank claimed, its WELCOME),
the checks every worker's request passes first, heartbeats, LEAVE, and the workers that fall silent or never
join, who leave the active set so no barrier waits for them. It owns whose plan the shard holds (plans.py),
who holds each rank (identity.py) and what is said of workers not joined (joining.py); liveness is in the
shard's state (a checkpoint holds it). It calls the pulls' and pushes' handlers to forget a worker that
leaves, and replication's for the epoch and to send an expiry to the backups."""
from __future__ import annotations

import logging

import torch

from psrv.config.in_place import in_place_refusal
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError
from psrv.server import onebit_adam, validate
from psrv.server.membership.identity import Sessions
from psrv.server.membership.joining import JoinWatch
from psrv.server.membership.plans import Plans, model_of
from psrv.server.pushes.chunked import takes_chunks
from psrv.server.shard import Shard
from psrv.server.state import ShardState
from psrv.server.validate import HelloAgain

log = logging.getLogger("psrv.server")
NEEDS_ACTIVE = (MsgType.INIT, MsgType.PUSH, MsgType.PULL, MsgType.PUSH_PULL)


class Membership:
    """`service`: the ShardService (psrv/server/service.py) whose `reply`, `refuse`, `drain`, `pushes`, `pulls`
    and `replication` it uses."""

    def __init__(self, state: ShardState, service):
        self.state = state
        self.service = service
        cfg = state.cfg
        self.plans = Plans()  # whose plan it is: rank 0's, a checkpoint's, or another rank's until rank 0's HELLO
        self.joins = JoinWatch(shard=cfg.shard)
        self.sessions = Sessions(shard=cfg.shard, timeout=cfg.worker_timeout)
        self._last_check = state.now()

    def check_liveness(self) -> None:
        """Workers silent for worker_timeout, or never heard from for join_timeout, leave the active set;
        barriers stop waiting for them. The ones not joined are named (psrv/server/membership/joining.py)."""
        s = self.state
        s.liveness.look()
        if s.now() - self._last_check < 0.05:
            return
        self._last_check = s.now()
        self.joins.look(s.liveness, s.controller.active)
        expired = s.liveness.expired(s.controller.active, self.service.pulls.pending.workers())
        if not expired:
            self.service.drain()
            return
        unheard = s.liveness.unheard(expired)
        replicas = self.service.replication.replicas
        with replicas.deferring():
            replicas.send("expire", workers=expired, unheard=unheard)
            self.expire(expired, unheard)

    def expire(self, expired: list[int], unheard: list[int]) -> None:
        """Workers `expired` leave the active set for silence (`unheard`: never joined); a backup does it
        when its primary's stream says so."""
        s = self.state
        if unheard:
            self.joins.gave_up(unheard, s.liveness, others=bool(set(s.controller.active) - set(expired)))
        for w in expired:
            if w not in unheard:
                log.warning("shard %d: worker %d silent for %.1fs, removed from the active set",
                            s.cfg.shard, w, s.liveness.silent(w))
            s.stats.lost_workers.append(w)
            s.liveness.lost.add(w)
            self.remove(w, what="lost")
        self.service.drain()

    def on_hello(self, peer, msg: Message) -> None:
        s, pulls, replication = self.state, self.service.pulls, self.service.replication
        _, size = validate.hello(s.cfg, msg)
        model = model_of(msg)
        pull_copy = pulls.copies.check(msg.worker, msg.fields.get("pull"), size)  # compressed pulls' settings
        heard = msg.worker in s.liveness.last_seen if s.judged is None else bool(s.judged["heard"])
        try:  # rank 0's plan is the shard's; another rank's model is refused by its rank (membership/plans.py)
            settled = self.plans.hello(msg.worker, model, heard=heard,
                                       initialised=s.shard is not None and s.shard.initialised)
        except ProtocolError:
            if not heard:  # never joined: no barrier waits for it to
                self._drop_misfit(msg.worker)
            raise
        if settled.build:  # the first HELLO, or rank 0's with another plan than the one the empty shard was built on
            # shared memory: sent by place. Shared from an untouched buffer, which costs no resident memory
            weights = s.transport.share(torch.empty(size, dtype=torch.float32, device=s.cfg.device))
            s.shard = Shard(size, s.cfg.optimizer, device=s.cfg.device, weights=weights)
        s.plan_hash = self.plans.hash
        s.plan_total = int(msg.fields["total"])
        for worker, refusal in settled.expelled.items():  # welcomed on another plan than rank 0's: refused now
            for pending in [p for p in pulls.pending if p.worker == worker]:
                for waiting in pending.peers:
                    self.service.refuse(waiting, pending.seq, refusal)
            pulls.pending.drop(worker)
            self._drop_misfit(worker)
        took_over = self._claim(msg)
        if took_over and msg.worker in s.controller.active:  # its old process died (silent): it starts anew
            self.remove(msg.worker, what="lost")
        pulls.copies.greet(msg.worker, pull_copy)  # whatever copy it held is forgotten: its next pull is dense
        pulls.pending.drop(msg.worker)  # a restarted worker's old pulls
        self.service.pushes.forget(msg.worker)  # and its half-sent push, and those held while another was half applied
        if msg.worker in s.liveness.left or msg.worker not in s.controller.active:
            if msg.worker in s.liveness.lost:
                log.info("shard %d: worker %d rejoined", s.cfg.shard, msg.worker)
            s.liveness.rejoined(msg.worker)
            s.controller.join(msg.worker)
            s.history.record("member", w=msg.worker, what="join", epoch=replication.epoch,
                             from_clock=s.controller.counted_from(msg.worker))
            s.stats.membership(s.controller.active, {})
        self.service.reply(peer, Message(MsgType.WELCOME, seq=msg.seq, fields={
            "shard": s.cfg.shard, "mode": s.cfg.mode, "staleness": s.cfg.staleness,
            "version": s.shard.version, "clock": s.controller.next_clock(msg.worker),
            "initialised": s.shard.initialised, "size": s.shard.size,
            "last_seq": s.dedup.last_seq(msg.worker), "worker_timeout": s.cfg.worker_timeout,
            "failure_bound": s.cfg.failure_bound,
            "clip_grad_norm": s.cfg.optimizer.clip_grad_norm, "onebit": onebit_adam.welcome(s.cfg.optimizer),
            "optimizer": validate.optimizer_welcome(s.cfg.optimizer),
            "chunks": takes_chunks(s.cfg), "replicas": replication.replicas.addresses, "epoch": replication.epoch,
            "pull_in_place": not in_place_refusal(s.cfg)}))

    def on_heartbeat(self, peer, msg: Message) -> None:
        """A beat from the worker's heartbeat thread, or a client's probe: do we still hold its
        request `probe` (a deferred pull)? If not, the client re-sends it."""
        s = self.state
        fields = {"active": msg.worker in s.controller.active}
        probe = msg.fields.get("probe")
        if probe is None:
            s.liveness.seen(msg.worker, heartbeat=True)
        else:
            holding = self.service.pulls.pending.holding(msg.worker, probe) or \
                self.service.pushes.held.holding(msg.worker, probe)
            fields.update(probe=probe, holding=holding, **self.service.replication.replicas.said())  # its replicas now
        self.service.reply(peer, Message(MsgType.OK, seq=msg.seq, fields=fields))

    def on_leave(self, peer, msg: Message) -> None:
        s = self.state
        s.liveness.left.add(msg.worker)
        self.remove(msg.worker, what="leave")
        self.service.reply(peer, Message(MsgType.OK, seq=msg.seq))

    def remove(self, worker: int, *, what: str) -> None:
        s = self.state
        if worker in s.controller.active:
            s.history.record("member", w=worker, what=what, epoch=self.service.replication.epoch)
        self.service.pushes.forget(worker)
        self.service.pulls.forget(worker)
        s.controller.leave(worker)
        s.speeds.forget(worker)
        s.stats.membership(s.controller.active, {})
        s.stats.departed(worker)
        self.service.pushes.commit_if_ready()
        self.service.pulls.release()

    def _drop_misfit(self, worker: int) -> None:
        """A worker refused for its model leaves the active set, as with LEAVE, so no barrier waits for it;
        unless it is the last one there, whose leaving would end the shard."""
        if self.state.controller.active - {worker}:
            self.remove(worker, what="misfit")

    def check_worker(self, msg: Message) -> None:
        s = self.state
        if not 0 <= msg.worker < s.cfg.workers:
            first = s.cfg.first_rank
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"worker id {msg.worker + first} outside [{first}, "
                                f"{first + s.cfg.workers}) (--first-rank, --workers)" if first else
                                f"worker id {msg.worker} outside [0, {s.cfg.workers}) (--workers)")
        if msg.type in NEEDS_ACTIVE and msg.worker in self.plans.refused:  # another model than rank 0's
            raise self.plans.refused[msg.worker]
        if msg.type is not MsgType.HELLO:  # a HELLO claims its rank once its plan is checked (on_hello)
            self._claim(msg)
        if msg.type in NEEDS_ACTIVE:
            s.dedup.note(msg.worker, msg.seq)
        if msg.type in NEEDS_ACTIVE and s.shard is not None and msg.worker not in s.controller.active:
            why = "left" if msg.worker in s.liveness.left else "was dropped after silence"
            raise HelloAgain(f"worker {msg.worker} {why}; send HELLO to rejoin")

    def _claim(self, msg: Message) -> bool:
        """msg's process holds its rank (RANK_IN_USE while another live one does); heard from now. True: a
        HELLO of a new process that took the rank over from a silent one. The silence is the primary's
        judgement where this is a backup applying its stream (ShardState.judged)."""
        s = self.state
        silent = s.liveness.silent(msg.worker) if s.judged is None else float(s.judged["silent"])
        took_over = self.sessions.check(msg, active=msg.worker in s.controller.active, silent=silent)
        s.liveness.seen(msg.worker)
        return took_over
