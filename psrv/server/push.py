"""A whole push (a PUSH or PUSH_PULL not in chunks; those are psrv/server/chunked.py's): validated,
deduplicated, then applied, accumulated or dropped as the consistency controller says, and sync's commit
of a clock once its accumulated pushes are complete. `s` below is the psrv/server/service.py ShardService
that calls these, a module that imports this one, used through its public members only."""
from __future__ import annotations

import logging
import time

from psrv.protocol import ErrorCode, Message, ProtocolError
from psrv.server import onebit_adam, validate
from psrv.server.consistency import Decision
from psrv.server.dedup import refused_again
from psrv.server.fragments import fragment_key, numel
from psrv.server.rules import PushContext

log = logging.getLogger("psrv.server")


def take_push(s, msg: Message) -> dict:
    """Accept one gradient: validate, dedup, then apply / accumulate / drop as the controller says.
    A non-finite one is never applied: refused (--nonfinite reject) or dropped (skip), counted once."""
    started = time.perf_counter()
    shard = s.ready_shard(msg, need_init=True)
    fragment = fragment_key(msg, shard.size)  # streaming DiLoCo: one fragment's elements (psrv/server/fragments.py)
    grad = validate.push(msg, shard.size if fragment is None else numel(fragment))  # dense, or checked compressed
    validate.push_kind(msg, s.cfg.optimizer)  # a velocity or momentum only where the optimizer takes one
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
        s.record_answer(msg, {"version": shard.version, "refused": refusal})
        raise ProtocolError(ErrorCode.NONFINITE, refusal)
    if s.controller.catch_up(msg.clock):
        log.warning("shard %d: worker %d pushed clock %d, ahead of this restored shard; skipping to it",
                    s.cfg.shard, msg.worker, msg.clock)
        s.stats.drop("late", shard.discard_accumulated())  # the others applied that clock without us
    pushed = s.controller.clocks.get(msg.worker, 0)
    decision = s.controller.push(msg.worker, msg.clock)
    if decision is Decision.DROP:
        s.stats.drop("late")
        s.stats.pushed(time.perf_counter() - started, None)
        stale = s.late.dropped(msg.worker, clock=msg.clock, pushed=pushed,
                               open_clock=s.controller.next_clock(msg.worker))
        return s.record_answer(msg, {"version": shard.version, "dropped": "late", "staleness": 0, **stale})
    s.late.applied(msg.worker)
    if not finite:  # --nonfinite skip: the worker's clock moves on (sync: its clock applies without it)
        s.controller.void(msg.worker)
        s.stats.drop("invalid")
        s.stats.pushed(time.perf_counter() - started, None)
        info = s.record_answer(msg, {"version": shard.version, "dropped": "nonfinite", "staleness": 0})
        commit_if_ready(s)
        return info
    staleness = max(0, shard.version - msg.base_version)
    s.before_write()  # replies still reading the weights must leave before we write them
    if decision is Decision.APPLY:  # the update rule sees the push's context (psrv/server/rules)
        ctx = PushContext(msg.worker, msg.clock, msg.base_version, staleness)
        scale = shard.apply(grad, ctx) if fragment is None else s.fragments.apply(shard, fragment, grad, ctx)
        s.stats.applied(shard.version, lr_scale=scale)
    else:
        if fragment is None:
            s.fragments.check_whole()
            shard.accumulate(grad, momentum=onebit_adam.is_momentum(msg))
        else:
            s.fragments.accumulate(shard, fragment, grad)
        s.took(msg, version=shard.version)  # in the history before the clock it may close (docs/history.md)
        commit_if_ready(s)
    s.stats.pushed(time.perf_counter() - started, staleness)
    s.stats.membership(s.controller.active, {msg.worker: s.controller.clocks[msg.worker]})
    return s.record_answer(msg, {"version": shard.version, "staleness": staleness},
                           recorded=decision is not Decision.APPLY)


def commit_if_ready(s) -> None:
    """Sync: apply the open clock once the controller says it is complete; a clock whose every push
    was dropped as non-finite, or that no worker is left to push while a joiner waits past it, moves on
    without a step (nothing to average)."""
    if s.shard is None or not s.controller.commit_ready():
        return
    if s.shard.accumulated or s.fragments.accumulated:
        s.before_write()
        # the rule sees the mean at staleness 0 (lr scale 1); a fragment's with its own optimizer
        n = s.shard.apply_accumulated() if s.shard.accumulated else s.fragments.apply_accumulated(s.shard)
        s.stats.applied(s.shard.version, pushes=n)
    else:
        log.warning("shard %d: clock %d had no finite gradient (or no worker left to push it); moving on "
                    "without a step", s.cfg.shard, s.controller.next_clock(-1))
    c = s.controller
    s.history.record("commit", clock=c.next_clock(-1), version=s.shard.version, epoch=s.epoch,
                     pushed=sorted(c.arrived - c.voided), arrived=sorted(c.arrived), pushing=sorted(c.pushing()),
                     active=sorted(c.active), need=c.needed())
    s.controller.committed()
