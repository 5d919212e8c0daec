"""Who works with a shard, a mixin of ShardService (psrv/server/service.py): a worker's HELLO (its plan checked
against rank 0's, its rank claimed, its WELCOME), the checks every worker's request passes first, heartbeats,
LEAVE, and the workers that fall silent or never join, who leave the active set so no barrier waits for them.
Apart from the service's loop because a worker's joining, staying and leaving is one concern, while the loop
decodes, dispatches and replies. It reads the service's attributes: cfg, transport, now, shard, plan_hash, plans,
controller, liveness, joins, sessions, pending, pulls, chunks, held, dedup, speeds, stats, replicas and
_last_check; and its methods _reply, _refuse, _drain, _release (psrv/server/pull_answers.py)."""
from __future__ import annotations

import logging

import torch

from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError
from psrv.server import onebit_adam, validate
from psrv.server.chunked import takes_chunks
from psrv.server.push import commit_if_ready
from psrv.server.shard import Shard
from psrv.server.validate import HelloAgain

log = logging.getLogger("psrv.server")
NEEDS_ACTIVE = (MsgType.INIT, MsgType.PUSH, MsgType.PULL, MsgType.PUSH_PULL)


class ShardMembership:
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
            self.replicas.send("expire", workers=expired, unheard=unheard)
            self.expire(expired, unheard)

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
            self._remove(w, what="lost")
        self._drain()

    def _on_hello(self, peer, msg: Message) -> None:
        _, size = validate.hello(self.cfg, msg)
        model = validate.model(msg)
        pull_copy = self.pulls.check(msg.worker, msg.fields.get("pull"), size)  # compressed pulls' settings
        heard = msg.worker in self.liveness.last_seen if self.judged is None else bool(self.judged["heard"])
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
        took_over = self._claim(msg)
        if took_over and msg.worker in self.controller.active:  # its old process died (silent): it starts anew
            self._remove(msg.worker, what="lost")
        self.pulls.greet(msg.worker, pull_copy)  # whatever copy it held is forgotten: its next pull is dense
        self.pending.drop(msg.worker)  # a restarted worker's old pulls
        self.chunks.forget(msg.worker)  # and its half-sent push
        self.held.drop(msg.worker)  # and the pushes it sent while another push was half applied
        if msg.worker in self.liveness.left or msg.worker not in self.controller.active:
            if msg.worker in self.liveness.lost:
                log.info("shard %d: worker %d rejoined", self.cfg.shard, msg.worker)
            self.liveness.rejoined(msg.worker)
            self.controller.join(msg.worker)
            self.history.record("member", w=msg.worker, what="join", epoch=self.epoch,
                                from_clock=self.controller.counted_from(msg.worker))
            self.stats.membership(self.controller.active, {})
        self._reply(peer, Message(MsgType.WELCOME, seq=msg.seq, fields={
            "shard": self.cfg.shard, "mode": self.cfg.mode, "staleness": self.cfg.staleness,
            "version": self.shard.version, "clock": self.controller.next_clock(msg.worker),
            "initialised": self.shard.initialised, "size": self.shard.size,
            "last_seq": self.dedup.last_seq(msg.worker), "worker_timeout": self.cfg.worker_timeout,
            "failure_bound": self.cfg.failure_bound,
            "clip_grad_norm": self.cfg.optimizer.clip_grad_norm, "onebit": onebit_adam.welcome(self.cfg.optimizer),
            "optimizer": validate.optimizer_welcome(self.cfg.optimizer),
            "chunks": takes_chunks(self.cfg), "replicas": self.replicas.addresses, "epoch": self.replicas.epoch}))

    def _on_heartbeat(self, peer, msg: Message) -> None:
        """A beat from the worker's heartbeat thread, or a client's probe: do we still hold its
        request `probe` (a deferred pull)? If not, the client re-sends it."""
        fields = {"active": msg.worker in self.controller.active}
        probe = msg.fields.get("probe")
        if probe is None:
            self.liveness.seen(msg.worker, heartbeat=True)
        else:
            fields.update(probe=probe, holding=self.pending.holding(msg.worker, probe)
                          or self.held.holding(msg.worker, probe), **self.replicas.said())  # its replicas now
        self._reply(peer, Message(MsgType.OK, seq=msg.seq, fields=fields))

    def _on_leave(self, peer, msg: Message) -> None:
        self.liveness.left.add(msg.worker)
        self._remove(msg.worker, what="leave")
        self._reply(peer, Message(MsgType.OK, seq=msg.seq))

    def _remove(self, worker: int, *, what: str) -> None:
        if worker in self.controller.active:
            self.history.record("member", w=worker, what=what, epoch=self.epoch)
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
            self._remove(worker, what="misfit")

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

    def _claim(self, msg: Message) -> bool:
        """msg's process holds its rank (RANK_IN_USE while another live one does); heard from now. True: a
        HELLO of a new process that took the rank over from a silent one. The silence is the primary's
        judgement where this is a backup applying its stream (ShardService.judged)."""
        silent = self.liveness.silent(msg.worker) if self.judged is None else float(self.judged["silent"])
        took_over = self.sessions.check(msg, active=msg.worker in self.controller.active, silent=silent)
        self.liveness.seen(msg.worker)
        return took_over
