"""How a shard answers pulls, a mixin of ShardService (psrv/server/service.py): a PULL, or the pull half of a
PUSH_PULL, waits as a pending reply (psrv/server/pending.py) until the consistency controller allows it, and is
then answered with the shard's weights, or under compressed pulls with their change since the worker's copy
(psrv/server/pulls.py); a streaming DiLoCo pull (its `fragment` field, psrv/server/fragments.py) with that
fragment's weights only. Apart from the service's loop because this is what a pull is answered with and when,
one concern, while the loop decodes, dispatches and replies. It reads the service's attributes: cfg, shard,
controller, pending, pulls, speeds, stats, chunks, now; and its methods ready_shard, _push_or_chunk, _reply."""
from __future__ import annotations

from psrv.protocol import Message, MsgType
from psrv.server.fragments import fragment_key
from psrv.server.pending import Pending
from psrv.server.push import commit_if_ready


class PullAnswers:
    def _on_pull(self, peer, msg: Message, push: dict | None = None, clock: int | None = None) -> None:
        shard = self.ready_shard(msg, need_init=False)
        self.pulls.expect(msg)
        final = bool(msg.fields.get("final"))
        fragment = fragment_key(msg, shard.size)
        self.pending.add(peer, worker=msg.worker, seq=msg.seq, clock=msg.clock if clock is None else clock,
                         final=final, received=self.now(), push=push, view=msg.fields.get("view", 0),
                         fragment=fragment)
        if final:  # it pushes no more: a rejoined worker still behind must not wait for it
            if msg.worker in self.controller.active and msg.worker not in self.controller.finishing:
                self.history.record("member", w=msg.worker, what="finish", epoch=self.epoch)
            self.controller.finish(msg.worker)
            commit_if_ready(self)
        else:  # the clock it pushes next: a sync joiner counts from there
            was = self.controller.counted_from(msg.worker)
            self.controller.expect(msg.worker, msg.clock if clock is None else clock)
            if self.controller.counted_from(msg.worker) != was:
                self.history.record("member", w=msg.worker, what="expect", epoch=self.epoch,
                                    from_clock=self.controller.counted_from(msg.worker))
        self._release()

    def _on_push_pull(self, peer, msg: Message) -> None:
        self.pulls.expect(msg)  # before the push: a re-sent one after the HELLO is applied once
        self.speeds.report(msg.worker, msg.fields)
        pushed = self._push_or_chunk(msg)
        if pushed is None:  # a chunk, not the push's last: its pull is registered with the last
            return
        info = {**pushed, **self.speeds.fastest(self.controller.active)}
        self._on_pull(peer, msg, push=info, clock=msg.clock + 1)

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
                  "waited": waited, "gap": gap, **self.replicas.said(), **extra}
        notes = [("answer", {"w": p.worker, "seq": p.seq, "clock": p.clock, "version": self.shard.version,
                             "epoch": self.replicas.epoch})]
        if p.push is not None:
            fields["push"] = p.push
            notes.append(("ack", {"w": p.worker, "seq": p.seq, "epoch": self.replicas.epoch,
                                  "version": p.push.get("version"), "dropped": p.push.get("dropped")}))
        for peer in p.peers:
            self._reply(peer, Message(MsgType.WEIGHTS, seq=p.seq, fields=fields, tensor=tensor, parts=parts), notes)
            notes = None  # recorded once, however many connections the pull came on
