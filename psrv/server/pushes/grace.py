"""A quorum's grace window (`--quorum-grace SECONDS`, psrv/server/consistency/quorum.py): once the open merge has
its Q workers, it waits up to SECONDS for the others' pushes. Time is read by the primary alone, as each
replicated request arrives (ShardService._judge sends `merge_due` with it in the stream): the window closes at
the first request after it is over, on the primary and on every backup alike, never in between. A merge whose
window is over closes before that request is handled, so a push arriving then joins the next merge.

Adaptive (`--quorum-grace-adaptive`): the window is worth holding only for a worker that will push before the
merge's own workers push again (then they would push into it a second time, on weights a merge old). So, judged
by the primary as the push that completes the quorum arrives: each worker's next push is expected at its last
push plus its mean interval between pushes (`PushTimes`); the window runs until the earliest expected re-push of a
worker inside the merge, at most SECONDS, if some worker still pushing outside it is expected by then (or is new
or late by less than one interval: it may be about to push); otherwise it is zero, and the merge closes with that
push, as with no window. A worker late by more than an interval (dead, or far slower) is not waited for.

Where merges are per fragment (streaming DiLoCo's fragments under a quorum), each fragment's merge has a window of
its own, and the primary's judgement lists the parts whose windows are over (`merge_due`)."""
from __future__ import annotations

from collections.abc import Iterable

from psrv.protocol import Message, MsgType
from psrv.server.fragments import part_of
from psrv.server.state import ShardState

PUSHES = (MsgType.PUSH, MsgType.PUSH_PULL)


class PushTimes:
    """Each worker's last push and its mean interval between pushes (each new interval weighs half), on one clock."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}
        self.gap: dict[int, float] = {}

    def saw(self, worker: int, t: float) -> None:
        if worker in self.last:
            interval = t - self.last[worker]
            self.gap[worker] = interval if worker not in self.gap else (self.gap[worker] + interval) / 2
        self.last[worker] = t

    def forget(self, worker: int) -> None:
        self.last.pop(worker, None)
        self.gap.pop(worker, None)


def planned_end(controller, worker: int, t: float, times: PushTimes, longest: float) -> float | None:
    """Where a push of `worker` arriving at `t` would give `controller`'s selected merge its Q workers, the end of
    its adaptive window (adaptive_end, `t` itself for none); else None. The shard's primary and the simulator ask
    it alike."""
    if not controller.completes(worker):
        return None
    inside = controller.arrived | {worker}
    return adaptive_end(t, inside, (w for w in controller.pushing() if w not in inside), times, longest)


def adaptive_end(t: float, inside: set[int], outside: Iterable[int], times: PushTimes, longest: float) -> float:
    """When an adaptive window that opens at `t` ends: at `t` itself (none), or at the earliest expected re-push
    of a worker `inside` the merge, at most `t + longest`, where a worker `outside` it (still pushing) may push
    by then. A worker without an interval yet may push at any time; so may one whose expected push is past by
    less than its interval."""
    bound = min([t + longest] + [times.last[w] + times.gap[w] for w in inside if w in times.gap])
    for w in outside:
        if w not in times.gap:
            return bound
        expected = times.last[w] + times.gap[w]
        if expected <= bound and expected + times.gap[w] >= t:
            return bound
    return t


class GraceWindow:
    def __init__(self, state: ShardState):
        self.state = state
        self.seconds = state.cfg.quorum_grace if state.cfg.quorum else 0.0
        self.adaptive = bool(self.seconds and state.cfg.quorum_grace_adaptive)
        self.until: dict[int | None, float] = {}  # each part's open merge with its Q workers: when its window ends
        self.times = PushTimes()  # adaptive: each worker's pushes, as the primary saw them arrive
        self._planned: tuple[int | None, float] | None = None  # adaptive: the part and end judged for the push in
        # hand, if it completes that part's Q

    def judged(self, msg: Message) -> dict:
        """The primary's judgement for the request in hand: the parts whose merge's window is over. Adaptive, for
        the push that gives its part's merge its Q workers: is its window none at all (then it closes with this
        push)?"""
        if not self.seconds:
            return {}
        self._planned = None  # a plan is for the request that made it: one unused (its push dropped) goes
        now = self.state.now()
        due = [part for part, until in self.until.items() if now >= until]
        if self.adaptive and msg.type in PUSHES:
            self.times.saw(msg.worker, now)
            part = _part(msg)
            c = self.state.controller
            if part not in self.until:
                c.select(part)
                planned = planned_end(c, msg.worker, now, self.times, self.seconds)
                if planned is not None:
                    self._planned = (part, planned)
                    due += [part] if planned <= now else []
        return {"merge_due": due}

    def opened(self, part: int | None) -> None:
        """Part `part`'s merge (selected) was looked at and stays open: its window starts once it has its Q
        workers."""
        c = self.state.controller
        if self.seconds and part not in self.until and c.met():
            planned = None
            if self._planned is not None and self._planned[0] == part:  # its window starts now: the plan is used
                planned, self._planned = self._planned[1], None
            self.until[part] = planned if planned is not None else self.state.now() + self.seconds
        # a merge looked at before the push in hand is in it (another part's window ended first) keeps the plan

    def closed(self, part: int | None) -> None:
        self.until.pop(part, None)

    def forget(self, worker: int) -> None:
        self.times.forget(worker)

    def restart(self) -> None:
        """Another state was loaded (a checkpoint, or a primary's state on its backup): the windows held were the
        merges replaced; a loaded merge that has its Q workers gets a window from now (`opened`, called by the
        push handler's `reloaded`), as the state holds no time."""
        self.until.clear()
        self._planned = None

    def take(self, judged: dict | None) -> bool:
        """The request in hand's judgement, before it is handled: True where it ends a merge's window."""
        if not self.seconds or not judged or not judged.get("merge_due"):
            return False
        for part in judged["merge_due"]:
            self.state.controller.select(part)
            self.state.controller.expire()
        return True


def _part(msg: Message) -> int | None:
    """The part a push names, as psrv/server/fragments.py `part_of` gives it (None: a whole push, or a field too
    malformed to name one: such a push is refused when it is handled)."""
    try:
        return part_of(tuple(tuple(r) for r in msg.fields["fragment"]))
    except (KeyError, TypeError, IndexError):
        return None
