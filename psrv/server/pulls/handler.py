"""The shard's pulls: a PULL, or the pull half of a PUSH_PULL, waits as a pending reply (pending.py) until the
consistency controller allows it, and is then answered with the shard's weights, or under compressed pulls
with their change since the worker's copy (copies.py); a streaming DiLoCo pull (its `fragment` field,
psrv/server/fragments.py) with that fragment's weights only. It calls the pushes' handler for a PUSH_PULL's
push, and reads replication's epoch and replicas for its answers."""
from __future__ import annotations

from psrv.protocol import Message, MsgType
from psrv.server.fragments import fragment_key
from psrv.server.pulls.copies import PullCopies
from psrv.server.pulls.pending import Pending, PendingPulls
from psrv.server.state import ShardState


class Pulls:
    """`service`: the ShardService (psrv/server/service.py) whose `reply`, `pushes` and `replication` it uses."""

    def __init__(self, state: ShardState, service):
        self.state = state
        self.service = service
        self.pending = PendingPulls()
        self.copies = PullCopies(state.cfg.shard)  # the workers' copies under compressed pulls

    def on_pull(self, peer, msg: Message, push: dict | None = None, clock: int | None = None) -> None:
        s = self.state
        shard = s.ready_shard(msg, need_init=False)
        self.copies.expect(msg)
        final = bool(msg.fields.get("final"))
        fragment = fragment_key(msg, shard.size)
        self.pending.add(peer, worker=msg.worker, seq=msg.seq, clock=msg.clock if clock is None else clock,
                         final=final, received=s.now(), push=push, view=msg.fields.get("view", 0),
                         fragment=fragment)
        epoch = self.service.replication.epoch
        if final:  # it pushes no more: a rejoined worker still behind must not wait for it
            if msg.worker in s.controller.active and msg.worker not in s.controller.finishing:
                s.history.record("member", w=msg.worker, what="finish", epoch=epoch)
            s.controller.finish(msg.worker)
            self.service.pushes.commit_if_ready()
        else:  # the clock it pushes next: a sync joiner counts from there
            was = s.controller.counted_from(msg.worker)
            s.controller.expect(msg.worker, msg.clock if clock is None else clock)
            if s.controller.counted_from(msg.worker) != was:
                s.history.record("member", w=msg.worker, what="expect", epoch=epoch,
                                 from_clock=s.controller.counted_from(msg.worker))
        self.release()

    def on_push_pull(self, peer, msg: Message) -> None:
        s = self.state
        self.copies.expect(msg)  # before the push: a re-sent one after the HELLO is applied once
        s.speeds.report(msg.worker, msg.fields)
        pushed = self.service.pushes.take(msg)
        if pushed is None:  # a chunk, not the push's last: its pull is registered with the last
            return
        info = {**pushed, **s.speeds.fastest(s.controller.active)}
        self.on_pull(peer, msg, push=info, clock=msg.clock + 1)

    def release(self) -> None:
        """Answer every pending pull the controller now allows."""
        shard = self.state.shard
        if shard is not None and shard.initialised and not self.service.pushes.chunks.applying:  # none half applied
            self.pending.release(self._ready, self._answer)

    def forget(self, worker: int) -> None:
        """`worker` left: its copy and its waiting pulls are forgotten."""
        self.copies.forget(worker)
        self.pending.drop(worker)

    def _ready(self, p: Pending) -> bool:
        c = self.state.controller
        return c.pull_ready(p.worker, p.clock) and (not p.final or c.active <= {p.worker})

    def _answer(self, p: Pending) -> None:
        s, shard = self.state, self.state.shard
        gap = s.controller.clock_gap(p.clock)
        waited = s.now() - p.received
        s.stats.answered(waited=waited, gap=gap)
        # the weights, or under compressed pulls their change since the worker's copy: the version it brings it to
        if p.fragment is None:
            extra, tensor, parts, held = self.copies.answer(p.worker, shard.weights, have=p.view, final=p.final)
            if s.cfg.mode != "sync":  # a sync clock's mean has no one worker's pulled weights
                shard.pulled(p.worker, held)
        else:  # streaming DiLoCo: that fragment's weights, or their change since the worker's copy of them
            extra, tensor, parts = self.copies.answer_fragment(p.worker, shard.weights, p.fragment,
                                                               have=p.view, final=p.final)
        replication = self.service.replication
        fields = {"version": shard.version, "clock": s.controller.next_clock(p.worker),
                  "waited": waited, "gap": gap, **replication.replicas.said(), **extra}
        notes = [("answer", {"w": p.worker, "seq": p.seq, "clock": p.clock, "version": shard.version,
                             "epoch": replication.epoch})]
        if p.push is not None:
            fields["push"] = p.push
            notes.append(self.service.pushes.acked(p.worker, p.seq, p.push))
        for peer in p.peers:
            self.service.reply(peer, Message(MsgType.WEIGHTS, seq=p.seq, fields=fields, tensor=tensor, parts=parts),
                               notes)
            notes = None  # recorded once, however many connections the pull came on
