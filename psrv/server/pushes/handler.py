"""The shard's pushes (PUSH, the push half of PUSH_PULL, INIT): a whole push validated, deduplicated, then
applied, accumulated or dropped as the consistency controller says; a chunked one applied as its chunks
arrive (psrv/server/pushes/chunked.py), the other workers' pushes held meanwhile (queued.py); sync's commit
of a clock once its pushes are in; and each push's answer, recorded for a re-send (dedup.py) and in the
history (docs/history.md). It calls the pulls' handler to answer the pulls a step allows, and replication's
to protect what the backups have not acknowledged before the weights are written."""
from __future__ import annotations

import logging
import time

from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError
from psrv.server import onebit_adam, validate
from psrv.server.consistency import Decision
from psrv.server.fragments import fragment_key, numel, part_of
from psrv.server.pushes.chunked import ChunkedPushes
from psrv.server.pushes.grace import GraceWindow
from psrv.server.dedup import refused_again
from psrv.server.pushes.late import LateStreaks
from psrv.server.pushes.queued import HeldPushes
from psrv.server.rules import PushContext
from psrv.server.state import ShardState

log = logging.getLogger("psrv.server")


class Pushes:
    """`service`: the ShardService (psrv/server/service.py) whose `reply`, `pulls` and `replication` it uses."""

    def __init__(self, state: ShardState, service):
        self.state = state
        self.service = service
        self.chunks = ChunkedPushes(self)  # pushes arriving chunk by chunk
        self.held = HeldPushes()  # other workers' pushes while a chunked one is half applied
        self.late = LateStreaks(shard=state.cfg.shard)
        self.grace = GraceWindow(state)  # a quorum's grace window (--quorum-grace)

    @property
    def epoch(self) -> int:
        return self.service.replication.epoch

    def forget_in_flight(self) -> None:
        """A state was loaded in place of the shard's (psrv/server/checkpoints/handler.py load_state_dict): a push
        half applied or held here belonged to the state replaced, so it is forgotten, uncounted (a backup taken
        back from its primary's state holds each such push there already; a worker still waiting re-sends and is
        answered from the state). Kept, a chunked push half applied on the old state was dropped as "partial" at
        its worker's next push, and stepped the loaded shard's version and optimizer once more."""
        self.chunks.open.clear()
        self.chunks.init = None
        self.held = HeldPushes()

    def reloaded(self) -> None:
        """A state was loaded in place of the shard's: the grace windows start anew from it, and a merge or barrier
        the loaded state makes ready commits, as after any change that can make one ready. A primary's state,
        with its finishing workers counted out first, has none ready (it was saved between requests); a
        checkpoint, which forgets who finished, may (a merge that now counts a finished worker's push). This
        keeps true what `end_grace` relies on: between requests, nothing is ready and every merge with its Q has a
        window."""
        self.grace.restart()
        self.commit_if_ready()

    # --- requests -------------------------------------------------------------
    def on_init(self, peer, msg: Message) -> None:
        if "chunk" in msg.fields:  # psrv/server/pushes/chunked.py
            fields = self.chunks.take_init(msg)
            if fields is not None:
                self.service.reply(peer, Message(MsgType.OK, seq=msg.seq, fields=fields))
                self.service.pulls.release()
            return
        shard = self.state.ready_shard(msg, need_init=False)
        values = validate.tensor(msg, shard.size)
        already = shard.initialised
        if not already:
            if not validate.is_finite(values):
                raise ProtocolError(ErrorCode.NONFINITE, "initial weights have NaN or Inf; refused")
            shard.init(values)
        self.service.reply(peer, Message(MsgType.OK, seq=msg.seq, fields={"already": already}))
        self.service.pulls.release()

    def on_push(self, peer, msg: Message) -> None:
        s = self.state
        s.speeds.report(msg.worker, msg.fields)
        pushed = self.take(msg)
        if pushed is None:  # a chunk, not the push's last: the push is answered once, at its end
            return
        info = {**pushed, **s.speeds.fastest(s.controller.active), **self.service.replication.replicas.said()}
        ack = self.acked(msg.worker, msg.seq, info)
        self.service.reply(peer, Message(MsgType.OK, seq=msg.seq, fields=info), [ack])
        self.service.pulls.release()

    def take(self, msg: Message) -> dict | None:
        """A whole push's answer; a chunk's (psrv/server/pushes/chunked.py) once its push is whole, else None."""
        return self.chunks.take(msg) if "chunk" in msg.fields else self.take_whole(msg)

    def take_whole(self, msg: Message) -> dict:
        """Accept one gradient: validate, dedup, then apply / accumulate / drop as the controller says.
        A non-finite one is never applied: refused (--nonfinite reject) or dropped (skip), counted once."""
        s = self.state
        started = time.perf_counter()
        shard = s.ready_shard(msg, need_init=True)
        fragment = fragment_key(msg, shard.size)  # streaming DiLoCo: one fragment's elements (psrv/server/fragments.py)
        grad = validate.push(msg, shard.size if fragment is None else numel(fragment))  # dense, or checked compressed
        validate.push_kind(msg, s.cfg.optimizer)  # a velocity or momentum only where the optimizer takes one
        weight = validate.inner_steps(msg) if s.cfg.quorum else 1  # a merge weighs a push by the steps it covers
        replayed = s.dedup.replay(msg.worker, msg.seq, shard.version)
        if replayed is not None:
            s.stats.duplicate()
            return refused_again(replayed)
        # a fragment push the worker found non-finite says so to every shard, one with no piece of it too
        finite = validate.all_finite(grad) and not (fragment is not None and msg.fields.get("nonfinite"))
        if not finite and s.cfg.nonfinite == "reject":  # recorded: a re-send is refused alike, not counted again
            s.stats.pushed(time.perf_counter() - started, None)
            s.stats.drop("invalid")
            refusal = "gradient has NaN or Inf; refused (see --nonfinite)"
            self.record_answer(msg, {"version": shard.version, "refused": refusal})
            raise ProtocolError(ErrorCode.NONFINITE, refusal)
        if s.controller.catch_up(msg.clock):
            log.warning("shard %d: worker %d pushed clock %d, ahead of this restored shard; skipping to it",
                        s.cfg.shard, msg.worker, msg.clock)
            s.stats.drop("late", shard.discard_accumulated())  # the others applied that clock without us
        pushed = s.controller.clocks.get(msg.worker, 0)
        staleness = max(0, shard.version - msg.base_version)
        part = part_of(fragment) if s.cfg.quorum and fragment is not None else None  # a quorum merges per fragment
        decision = s.controller.push(msg.worker, msg.clock, staleness, part)
        if decision is Decision.DROP:
            s.stats.drop("late")
            s.stats.pushed(time.perf_counter() - started, None)
            stale = self.late.dropped(msg.worker, clock=msg.clock, pushed=pushed,
                                      open_clock=s.controller.next_clock(msg.worker))
            return self.record_answer(msg, {"version": shard.version, "dropped": "late", "staleness": 0, **stale})
        self.late.applied(msg.worker)
        if not finite:  # --nonfinite skip: the worker's clock moves on (sync: its clock applies without it)
            s.controller.void(msg.worker)
            s.stats.drop("invalid")
            s.stats.pushed(time.perf_counter() - started, None)
            info = self.record_answer(msg, {"version": shard.version, "dropped": "nonfinite", "staleness": 0},
                                      part=part)
            self.commit_if_ready([part])
            return info
        self.before_write()  # replies still reading the weights must leave before we write them
        if decision is Decision.APPLY:  # the update rule sees the push's context (psrv/server/rules)
            ctx = PushContext(msg.worker, msg.clock, msg.base_version, staleness)
            scale = shard.apply(grad, ctx) if fragment is None else s.fragments.apply(shard, fragment, grad, ctx)
            s.stats.applied(shard.version, lr_scale=scale)
        else:
            if fragment is None:
                s.fragments.check_whole()
                shard.accumulate(grad, momentum=onebit_adam.is_momentum(msg), weight=weight)
            else:
                s.fragments.accumulate(shard, fragment, grad, merge=bool(s.cfg.quorum), weight=weight)
            self.took(msg, version=shard.version, age=staleness, part=part)  # before the merge it may close (docs/history.md)
            self.commit_if_ready([part])
        s.stats.pushed(time.perf_counter() - started, staleness)
        s.stats.membership(s.controller.active, {msg.worker: s.controller.clocks[msg.worker]})
        return self.record_answer(msg, {"version": shard.version, "staleness": staleness},
                                  recorded=decision is not Decision.APPLY)

    def commit_if_ready(self, parts: list[int | None] | None = None) -> None:
        """Sync: apply the open clock once the controller says it is complete, or each quorum merge (one per
        fragment) that is; a clock whose every push was dropped as non-finite, or that no worker is left to
        push while a joiner waits past it, moves on without a step (nothing to average). `parts`: the merges to
        look at (a push's own, the only one it can complete), else every open one (a worker left, a window
        ended)."""
        s = self.state
        if s.shard is None:
            return
        for part in s.controller.parts() if parts is None else parts:
            s.controller.select(part)
            if s.controller.commit_ready():
                self._commit(part)
            else:
                self.grace.opened(part)

    def _commit(self, part: int | None) -> None:
        s = self.state
        if s.shard.accumulated or s.fragments.accumulated:  # a merge with a gradient has its fragment's
            self.before_write()
            # the rule sees the mean at staleness 0 (lr scale 1); a fragment's with its own optimizer
            steps = [s.shard.apply_accumulated()] if s.shard.accumulated else \
                s.fragments.apply_accumulated(s.shard, part)
            for n in steps:
                s.stats.applied(s.shard.version, pushes=n)
        else:
            log.warning("shard %d: clock %d had no finite gradient (or no worker left to push it); moving on "
                        "without a step", s.cfg.shard, s.controller.open_clock)
        c = s.controller
        s.history.record("commit", clock=c.open_clock, version=s.shard.version, epoch=self.epoch,
                         pushed=sorted(c.arrived - c.voided), arrived=sorted(c.arrived), pushing=sorted(c.pushing()),
                         active=sorted(c.active), need=c.needed(), **self._graced(),
                         **({} if part is None else {"part": part}))  # a quorum's merge of one fragment
        c.committed()
        self.grace.closed(part)

    def _graced(self) -> dict:
        """A quorum's merge in the history: whether its grace window closed it (then it may hold more than Q)."""
        c = self.state.controller
        return {"due": bool(c.due)} if self.grace.seconds else {}

    def end_grace(self, judged: dict | None) -> None:
        """Before a request is handled: where the primary judged the open merge's grace window over, it closes."""
        if self.grace.take(judged):
            self.commit_if_ready()

    def forget(self, worker: int) -> None:
        """`worker` left or restarted: its half-sent push is dropped, and the pushes it sent while another
        was half applied."""
        self.chunks.forget(worker)
        self.held.drop(worker)
        self.grace.forget(worker)

    # --- answers and their record ---------------------------------------------
    def record_answer(self, msg: Message, info: dict, *, recorded: bool = False, part: int | None = None) -> dict:
        """`info`, push `msg`'s answer, recorded so a re-send of it is answered alike (psrv/server/dedup.py),
        and in the history as applied or dropped unless `recorded` already (docs/history.md)."""
        self.state.dedup.record(msg.worker, msg.seq, info)
        if not recorded:
            self.took(msg, why=info.get("dropped") or ("invalid" if "refused" in info else None),
                      version=info.get("version"), part=part)
        return info

    def took(self, msg: Message, *, why: str | None = None, version: int | None = None, age: int | None = None,
             part: int | None = None) -> None:
        """Push `msg` in the history: applied (sync: into its clock's sum, with the merges since its weights,
        `age`), or dropped for `why`; `part`: the fragment whose quorum merge it went to."""
        where = {"w": msg.worker, "seq": msg.seq, "clock": msg.clock, "epoch": self.epoch,
                 **({} if part is None else {"part": part})}
        if why:
            self.state.history.record("drop", **where, why=why)
        else:
            self.state.history.record("apply", **where, version=version, **({} if age is None else {"age": age}))

    def acked(self, worker: int, seq: int, info: dict) -> tuple[str, dict]:
        """The history's event for push `seq` of `worker` acknowledged with `info` (its answer, alone or in a
        PUSH_PULL's WEIGHTS)."""
        return ("ack", {"w": worker, "seq": seq, "epoch": self.epoch,
                        "version": info.get("version"), "dropped": info.get("dropped")})

    def before_write(self) -> None:
        """Called right before the weights are written: what still views them, replies on the wire or held
        for the backups' acks, is sent or copied first."""
        self.service.replication.replicas.protect()
        self.state.transport.wait_sent()
