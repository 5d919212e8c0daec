"""The discrete-event core: N simulated workers and S simulated shards, one event per worker push.

Each shard holds psrv's own consistency controller (psrv/server/consistency), asked exactly as the
shard service asks it (psrv/server/service.py): push -> APPLY / ACCUMULATE / DROP, commit_ready ->
one update, pull_ready -> a held pull is answered. The simulator only adds time: compute, the network
model, the shard's handling time and the codecs' CPU time (experiments/simulate/codec_cost.py: a worker
encodes its pushes one shard after another, after its compute or, with overlap, between the parts of backward
that finish each slice (experiments/simulate/overlap.py), and decodes its replies one at a time; a shard decodes each push
and encodes each worker's reply on its one thread, in turn). A shard's link is first come first served and
every worker's messages cross it in the order they were sent, so a push is handled (at its own, later time)
in the event that sends it, and the heap holds one event per worker: its next push.

A learner (experiments/simulate/learning.py) may ride along: it computes each push's gradient on the
weights the worker pulled and applies it on a real psrv Shard, in the order simulated here.

Failures (`fail_mtbf`, experiments/simulate/failures.py): a worker fails at times drawn per worker; its pending event
is cancelled (each heap entry carries the worker's generation), the steps of its round not yet answered are lost and
done again, it leaves every shard's active set as the shard service's _remove makes it, and it rejoins after
`fail_down` seconds, pulling the weights for the clock the shards hand it before it computes again. Kills on psrv
run's nemesis schedule (experiments/simulate/kills.py) use the same steps, as a killed and restarted psrv worker
meets them instead."""
from __future__ import annotations

import heapq
from heapq import heappop, heappush
from collections import Counter
from dataclasses import dataclass, field

from psrv.experiments.simulate.codec_cost import CodecCost
from psrv.server.consistency import Decision, make_controller
from psrv.server.pushes.grace import PushTimes, planned_end

APPLY, ACCUMULATE, DROP = Decision.APPLY, Decision.ACCUMULATE, Decision.DROP


@dataclass
class Recorded:
    """What the simulation measured (all workers), and every step of the sampled workers."""

    staleness: Counter = field(default_factory=Counter)   # per push: the worst over its shards
    clock_gap: Counter = field(default_factory=Counter)   # per answered pull, per shard
    compute: float = 0.0
    communication: float = 0.0
    wait: float = 0.0
    pushes: int = 0
    dropped: list[int] = field(default_factory=list)      # per shard: the late pushes its controller dropped
    updates: list[int] = field(default_factory=list)      # per shard
    end: list[float] = field(default_factory=list)        # per worker: its last step's end
    failures: int = 0                                     # workers' failures
    shard_failures: int = 0                               # shards' failovers before the last step's end
    lost_steps: int = 0                                   # steps computed, then lost to a failure and done again
    skipped_steps: int = 0                                # steps a restarted or left-behind worker never did
    kills: list[dict] = field(default_factory=list)       # --nemesis: each kill made (experiments/simulate/kills.py)
    dropped_steps: int = 0                                # steps whose push some shard dropped (late)
    first_push: float | None = None                       # the span (goodput while every rank ran): its start,
    span_end: float | None = None                         # the first worker's last step's end,
    span_steps: int = 0                                   # and the useful steps done by then
    rows: list[dict] = field(default_factory=list)        # the sampled workers' steps
    hierarchy: dict | None = None                         # with regions: the syncs (experiments/simulate/regions.py)


class Cluster:
    def __init__(self, *, workers: int, shards: int, mode: str, staleness: int, backup_workers: int, quorum: int = 0,
                 quorum_max_age: int = 0, quorum_grace: float = 0.0, quorum_grace_adaptive: bool = False,
                 quorum_wait: bool = False,
                 steps: int, local_steps: int, compute: list[list[float]], latency: float,
                 push_transfer: tuple[float, ...], reply_transfer: tuple[float, ...], server_seconds: float, sample: int, batch_size: int,
                 learner=None, codec: CodecCost | None = None,
                 ready: list[tuple[int, float]] | None = None, compute_holds_encodes: bool = False,
                 failures=None, fragments: int = 1, record_updates: bool = False, shard_failures=None):
        self.n, self.s, self.steps, self.h = workers, shards, steps, local_steps
        # streaming DiLoCo's fragments under a quorum: a worker's k-th push carries fragment k mod F, and each
        # fragment has its own merges (psrv/server/consistency/quorum.py `select`); None: merges of whole pushes
        self.fragments = fragments if quorum and fragments > 1 else None
        self.controllers = [make_controller(mode, workers, staleness=staleness, backup_workers=backup_workers,
                                            quorum=quorum, quorum_max_age=quorum_max_age,
                                            quorum_grace=quorum_grace > 0, quorum_wait=quorum_wait)
                            for _ in range(shards)]
        self.grace = quorum_grace
        self.grace_until: list[dict] = [{} for _ in range(shards)]  # each shard's merges' windows: part -> end
        # adaptive (psrv/server/pushes/grace.py): each shard's view of the workers' pushes, and the end planned
        # for the push that completes a merge's quorum
        self.push_times = [PushTimes() for _ in range(shards)] if quorum_grace and quorum_grace_adaptive else None
        self.compute, self.latency = compute, latency
        self.server_seconds, self.sample, self.batch_size = server_seconds, sample, batch_size
        self.learner = learner
        self.version = [0] * shards
        self.base = [[0] * shards for _ in range(workers)]     # versions each worker last pulled
        self.clock = [0] * workers                              # the clock of each worker's next push
        self.done = [0] * workers                               # steps finished
        self.waiting = [[] for _ in range(shards)]              # held pulls: (clock, worker, since, its gen)
        self.in_free = [0.0] * shards                           # a shard's link, to it
        self.out_free = [0.0] * shards                          # and from it
        self.busy = [0.0] * shards                              # the shard's thread
        self.replies = [0] * workers                            # replies still due this step
        self.reply_at = [0.0] * workers                         # the last one's arrival
        self.held = [0.0] * workers                             # the longest a shard held this step's pull
        self.pushed_at = [0.0] * workers
        self.step_stale = [0] * workers
        self.round_compute = [0.0] * workers
        self.shards = list(zip(push_transfer, reply_transfer, self.controllers, self.waiting))  # a push's and a reply's seconds on a link
        codec = codec or CodecCost.none(shards)  # the codecs' seconds per message and shard
        self.encode, self.decode = codec.worker_push, codec.worker_pull
        self.unpack, self.pack = codec.shard_push, codec.shard_pull
        self.overlapping = ready is not None  # slices sent during backward (experiments/simulate/overlap.py)
        self.encoding = sum(self.encode)      # a worker's encodes of one push, all shards
        self.in_compute = self.encoding if compute_holds_encodes else 0.0  # already inside a step's compute
        self.started = [0.0] * workers        # when the pushing step's compute began
        self.pure = [0.0] * workers           # its compute without the encodes (0 without overlap)
        ready = ready if ready is not None else [(s, 0.0) for s in range(shards)]
        gaps = [f - before for (_, f), before in zip(ready, [0.0] + [f for _, f in ready])]
        self.order = [(s, gap, *self.shards[s]) for (s, _), gap in zip(ready, gaps)]  # in sending order
        self.heap: list[tuple[float, int, int]] = []          # (time, worker, its generation): its next push
        self.leaving: list[tuple[int, float]] = []             # workers done, their LEAVE not yet handled
        self.rec = Recorded(dropped=[0] * shards)
        self.gen = [0] * workers                                # bumped by a failure: the events before it are void
        self.round_first = [0] * workers                        # the first step of each worker's round
        self.round_start = [0.0] * workers                      # when its compute began
        self.round_dropped = [False] * workers                  # some shard dropped the round's push
        self.failures = failures                                # experiments/simulate/failures.py, or None
        self.outages = shard_failures                           # experiments/simulate/shard_failures.py, or None
        self.down = [False] * workers
        self.rejoining = [False] * workers                      # its replies answer a rejoin's pull, not a push
        # each shard's update times, for a region's syncs with the global shards (experiments/simulate/regions.py)
        self.update_times: list[list[float]] | None = [[] for _ in range(shards)] if record_updates else None

    # --- the loop -------------------------------------------------------------
    def run(self) -> Recorded:
        for w in range(self.n):
            self._start_round(w, 0.0)
        heap, push, leaving, gen = self.heap, self._push, self.leaving, self.gen
        fails = self.failures.heap if self.failures is not None else []
        while heap or leaving or fails:
            if leaving:  # after the event that ended their last step
                self.leave(*leaving.pop())
                continue
            if fails and (not heap or fails[0][0] <= heap[0][0]):
                self.failures.next(self)
                continue
            t, w, g = heapq.heappop(heap)
            if g == gen[w]:
                push(t, w)
        self.rec.updates = list(self.version)
        if self.outages is not None:
            self.rec.shard_failures = self.outages.until(max(self.rec.end, default=0.0))
        return self.rec

    def _start_round(self, w: int, t: float) -> None:
        """Worker `w` has its weights at `t`: it computes its next local_steps steps (1 without local
        steps), then pushes; the steps before the last push nothing."""
        first = self.done[w]
        last = min(first + self.h, self.steps)
        times = self.compute[w]
        self.round_first[w], self.round_start[w], self.round_dropped[w] = first, t, False
        for step in range(first, last - 1):
            t += times[step]
            self._row(w, step, t, times[step], 0.0, 0.0, None)
        self.done[w] = last - 1
        if self.overlapping:
            self._start_push(w, t, times[last - 1])
            self.rec.compute += sum(times[first:last - 1]) + self.round_compute[w]
            return
        self.rec.compute += sum(times[first:last])
        self.round_compute[w] = times[last - 1]
        heapq.heappush(self.heap, (t + times[last - 1], w, self.gen[w]))

    def _start_push(self, w: int, t: float, compute: float) -> None:
        """With overlap: worker `w` begins at `t` the step it pushes, `compute` seconds drawn for it; its
        event is its first slice's send (after forward, part of backward and that slice's encode). The step's
        compute is as the real worker records it: forward, backward and every slice's encode."""
        pure = compute - self.in_compute if compute > self.in_compute else 0.0
        self.started[w], self.pure[w] = t, pure
        self.round_compute[w] = pure + self.encoding
        first, gap = self.order[0][:2]
        heapq.heappush(self.heap, (t + gap * pure + self.encode[first], w, self.gen[w]))

    def _push(self, t: float, w: int) -> None:
        """Worker `w` sends each shard its slice (one PUSH_PULL each): without overlap, all after its compute,
        which ended at `t`; with overlap, each as backward finishes it (its first at `t`), the slices' encodes
        on the worker's thread between the parts of backward."""
        if self.rec.first_push is None:
            self.rec.first_push = t
        clock, base, lat, server = self.clock[w], self.base[w], self.latency, self.server_seconds
        learner, version, in_free, busy = self.learner, self.version, self.in_free, self.busy
        gaps, bases, out_free, held, reply_at = self.rec.clock_gap, self.base, self.out_free, self.held, self.reply_at
        clocks, replies, gen = self.clock, self.replies, self.gen
        encode, unpack, pack, decode, outages = self.encode, self.unpack, self.pack, self.decode, self.outages
        grad = learner.gradient(w, self.done[w]) if learner is not None else None
        pure = self.pure[w]
        if self.overlapping:                                    # step() is called after the last slice's encode
            sent = encoded = self.started[w]
            t = encoded + pure + self.encoding
        else:
            sent = encoded = t
        self.pushed_at[w], self.replies[w], self.held[w], self.reply_at[w] = t, self.s, 0.0, t
        self.step_stale[w] = 0
        for s, gap, tx, rtx, ctrl, waiting in self.order:
            encoded += gap * pure + encode[s]                   # backward up to this slice, then its encode
            start = encoded if encoded > sent else sent
            sent = start + tx                                   # the worker's link, one slice after another
            arrive = start + lat
            if in_free[s] > arrive:                             # the shard's link, first come first served
                arrive = in_free[s]
            arrive += tx
            if sent + lat > arrive:
                arrive = sent + lat
            in_free[s] = arrive
            start = arrive if arrive > busy[s] else busy[s]  # the shard's thread, a push at a time (past failovers)
            th = start + server + unpack[s] if outages is None else outages.run(s, start, server + unpack[s])
            busy[s] = th
            planned, part = None, None if self.fragments is None else clock % self.fragments
            if self.grace:
                over = [p for p, end in self.grace_until[s].items() if th >= end]
                for p in over:  # as the shard: a window over closes its merge before the push that finds it so
                    ctrl.select(p)
                    ctrl.expire()
                if over:
                    self._commit_all(s, ctrl)
                if self.push_times is not None:
                    planned = self._adaptive(s, w, th, ctrl, part)
            decision = ctrl.push(w, clock, version[s] - base[s], part)
            if decision is DROP:
                self.rec.dropped[s] += 1
                self.round_dropped[w] = True
            else:
                stale = version[s] - base[s]
                if stale > self.step_stale[w]:
                    self.step_stale[w] = stale
                if decision is APPLY:
                    if learner is not None:
                        learner.apply(s, w, clock, base[s], stale, grad)
                    version[s] += 1
                    if self.update_times is not None:
                        self.update_times[s].append(th)
                else:
                    if learner is not None:
                        learner.accumulate(s, grad)
                    if not self._commit_if_ready(s, ctrl, part) and self.grace and part not in self.grace_until[s] \
                            and ctrl.met():
                        self.grace_until[s][part] = planned if planned is not None else th + self.grace  # it opens
            heappush(waiting, (clock + 1, w, th, gen[w]))
            ready = ctrl.pull_ready
            while waiting and (waiting[0][3] != gen[waiting[0][1]] or ready(waiting[0][1], waiting[0][0])):
                pclock, pw, since, g = heappop(waiting)  # as release, inline: the hot path
                if g != gen[pw]:
                    continue  # the pull of a worker that failed since: dropped here, not searched for at the failure
                gaps[ctrl.clock_gap(pclock)] += 1
                bases[pw][s] = version[s]
                if learner is not None:
                    learner.answered(s, pw)
                start = th if th > busy[s] else busy[s]  # its reply encoded, one at a time
                packed = start + pack[s] if outages is None else outages.run(s, start, pack[s])
                busy[s] = packed
                out = (packed if packed > out_free[s] else out_free[s]) + rtx
                out_free[s] = out
                if th - since > held[pw]:
                    held[pw] = th - since
                reply_at[pw] = (out + lat if out + lat > reply_at[pw] else reply_at[pw]) + decode[s]
                nxt = ctrl.next_clock(pw)
                if nxt > clocks[pw]:
                    clocks[pw] = nxt
                replies[pw] -= 1
                if not replies[pw]:
                    self._step_done(pw)

    def _commit_if_ready(self, s: int, ctrl, part: int | None = None) -> bool:
        """Shard s's buffered pushes (of `part`, a quorum's merge of one fragment) as one step, where its
        controller says they are complete (sync's clock, a quorum's merge); whether it stepped."""
        ctrl.select(part)
        if not ctrl.commit_ready():
            return False
        if self.learner is not None:
            self.learner.commit(s)
        ctrl.committed()
        self.version[s] += 1
        self.grace_until[s].pop(part, None)
        return True

    def _commit_all(self, s: int, ctrl) -> None:
        """Every open merge of shard s that is complete steps (a worker left, windows ended)."""
        for part in ctrl.parts():
            self._commit_if_ready(s, ctrl, part)

    def _adaptive(self, s: int, w: int, th: float, ctrl, part: int | None) -> float | None:
        """As the shard's primary judges a push under an adaptive window: the push noted; where it completes its
        part's open merge's quorum, the window's end (the push itself, when none: the merge then closes with it)."""
        times = self.push_times[s]
        times.saw(w, th)
        ctrl.select(part)
        end = None if part in self.grace_until[s] else planned_end(ctrl, w, th, times, self.grace)
        if end is not None and end <= th:
            ctrl.expire()
        return end

    def release(self, s: int, t: float) -> None:
        """Answer every held pull of shard `s` the controller allows at `t`. pull_ready is monotone in
        the pull's clock for every controller, so the held pulls are kept by clock and the first one
        not ready ends the scan."""
        _, rtx, ctrl, waiting = self.shards[s]
        lat, ready, gaps, version, learner = self.latency, ctrl.pull_ready, self.rec.clock_gap, self.version[s], self.learner
        held, reply_at, clocks, replies, out_free = self.held, self.reply_at, self.clock, self.replies, self.out_free
        gen = self.gen
        if self.outages is not None:  # a shard failed over answers from its takeover
            t = self.outages.run(s, t, 0.0)
        while waiting and (waiting[0][3] != gen[waiting[0][1]] or ready(waiting[0][1], waiting[0][0])):
            clock, w, since, g = heappop(waiting)
            if g != gen[w]:
                continue  # the pull of a worker that failed since (failures.py fail)
            gaps[ctrl.clock_gap(clock)] += 1
            self.base[w][s] = version
            if learner is not None:
                learner.answered(s, w)
            packed = t
            if self.pack[s]:  # its reply encoded on the shard's thread, after what it is doing
                start = t if t > self.busy[s] else self.busy[s]
                packed = self.busy[s] = start + self.pack[s] if self.outages is None else \
                    self.outages.run(s, start, self.pack[s])
            out = (packed if packed > out_free[s] else out_free[s]) + rtx
            out_free[s] = out
            if t - since > held[w]:
                held[w] = t - since
            reply_at[w] = (out + lat if out + lat > reply_at[w] else reply_at[w]) + self.decode[s]
            nxt = ctrl.next_clock(w)  # the client takes the largest any shard names
            if nxt > clocks[w]:
                clocks[w] = nxt
            replies[w] -= 1
            if not replies[w]:
                self._step_done(w)

    def _step_done(self, w: int) -> None:
        """Every shard's reply reached worker `w`: its pushing step ends (after a rejoin: its first pull came,
        and it starts computing)."""
        end = self.reply_at[w]
        if self.rejoining[w]:
            self.rejoining[w] = False
            self._start_round(w, end)
            return
        in_flight = end - self.pushed_at[w]
        wait = min(self.held[w], in_flight)
        rec = self.rec
        rec.communication += in_flight - wait
        rec.wait += wait
        rec.pushes += 1
        rec.staleness[self.step_stale[w]] += 1
        step = self.done[w]
        if self.round_dropped[w]:
            rec.dropped_steps += step + 1 - self.round_first[w]
        self._row(w, step, end, self.round_compute[w], in_flight - wait, wait, self.step_stale[w])
        self.done[w] = step + 1
        if self.learner is not None:
            self.learner.step_done(w, step + 1, end)
        if step + 1 < self.steps:
            self._start_round(w, end)
        else:
            self.finish(w, end)

    def finish(self, w: int, end: float) -> None:
        """Worker `w` has no step left at `end`: it leaves (its LEAVE handled after this event)."""
        rec = self.rec
        if not rec.end:  # the first worker done: the span of every rank running ends (a real run's goodput)
            rec.span_end, rec.span_steps = end, sum(self.done) - rec.dropped_steps - rec.skipped_steps
        rec.end.append(end)
        self.leaving.append((w, end + self.latency))

    def leave(self, w: int, t: float) -> None:
        """Worker `w`'s LEAVE reaches every shard at `t`: as the shard service's _remove, it leaves the
        active set, and a clock or held pull waiting on it goes on."""
        for s, ctrl in enumerate(self.controllers):
            ctrl.leave(w)
            if self.push_times is not None:
                self.push_times[s].forget(w)  # as the shard forgets a worker that left
            th = t if t > self.busy[s] else self.busy[s]
            self._commit_all(s, ctrl)  # its window, if one ran, ends with it
            self.release(s, th)

    def _row(self, w: int, step: int, end: float, compute: float, comm: float, wait: float,
             staleness: int | None) -> None:
        if w < self.sample:
            row = {"wall_time": end, "worker": w, "step": step, "staleness": staleness or 0,
                   "compute_seconds": compute, "communication_seconds": comm, "wait_seconds": wait,
                   "batch_size": self.batch_size, "loss": ""}
            row["pushed"] = staleness is not None  # with local steps, the steps before a push push nothing
            if self.learner is not None:
                row["loss"] = self.learner.loss_of(w, step)
            self.rec.rows.append(row)
