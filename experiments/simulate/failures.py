"""Workers failing and rejoining in the simulator (`--fail-mtbf`, `--fail-down`; docs/simulator.md, "Failures").

Each worker fails after an exponential time of mean `mtbf` simulated seconds from its start or its last rejoin, its
draws its own (a generator seeded by the run's seed and its rank). A failure at t:
- voids the worker's pending event (Cluster.gen) and its held pulls;
- loses the steps of its round that began before t and were not answered: the worker does them again (a push that
  reached the shards stays applied; the worker never heard back, so it computes that round again too);
- takes it out of every shard's active set, as the shard service's _remove does (a barrier stops waiting for it).
`down` seconds later it rejoins every shard (Controller.join), pulls the weights for the clock the shards hand it
(sync: the clock after the open one), and starts its round when that pull is answered."""
from __future__ import annotations

import heapq
import random

FAIL, BACK = 0, 1
MAX_FAILURES_PER_STEP = 100  # past this, a worker would hardly ever finish a round: the run is refused


class Failures:
    def __init__(self, workers: int, *, mtbf: float, down: float, seed: int, steps: int):
        self.mtbf, self.down, self.steps = mtbf, down, steps
        self.draws = [random.Random(seed * 1_000_003 + w) for w in range(workers)]
        self.heap: list[tuple[float, int, int]] = []
        self.count = [0] * workers
        for w in range(workers):
            self._schedule(w, 0.0)

    def _schedule(self, w: int, t: float) -> None:
        heapq.heappush(self.heap, (t + self.draws[w].expovariate(1.0 / self.mtbf), w, FAIL))

    def next(self, cluster) -> None:
        """Handle the earliest failure or rejoin (the cluster's loop calls this when it comes first)."""
        t, w, kind = heapq.heappop(self.heap)
        if cluster.done[w] >= cluster.steps and not cluster.down[w]:
            return  # finished: it fails no more
        if kind == FAIL:
            self.count[w] += 1
            if self.count[w] > MAX_FAILURES_PER_STEP * self.steps:
                raise ValueError(f"worker {w} failed {self.count[w]} times: --fail-mtbf {self.mtbf:g} s is too short "
                                 "for a round of its steps to finish between failures")
            fail(cluster, w, t)
            heapq.heappush(self.heap, (t + self.down, w, BACK))
        else:
            rejoin(cluster, w, t)
            self._schedule(w, t)


def fail(c, w: int, t: float, *, leave: bool = True) -> None:
    """Worker `w` fails at `t`; `leave`: the shards learn of it at once (else at its new life's HELLO, or after their
    worker timeout: experiments/simulate/kills.py)."""
    rec = c.rec
    rec.failures += 1
    c.gen[w] += 1
    c.down[w], c.rejoining[w] = True, False
    started, step_start = 0, c.round_start[w]
    for step in range(c.round_first[w], min(c.round_first[w] + c.h, c.steps)):
        if step_start >= t:
            break
        started += 1
        step_start += c.compute[w][step]
    rec.lost_steps += started
    c.done[w] = c.round_first[w]
    c.replies[w] = 0
    # its held pulls stay in the shards' heaps, stale by the generation just raised: release drops them when they
    # come up (a scan of every held pull here cost each failure O(N))
    if w < c.sample:
        rec.rows[:] = [row for row in rec.rows if row["worker"] != w or row["wall_time"] <= t]
    if leave:
        c.leave(w, t)


def rejoin(c, w: int, t: float, *, from_clock: bool = False) -> None:
    """Worker `w` joins every shard again at `t` and pulls; `from_clock`: it starts at the first step of the clock
    the shards hand it, as a restarted psrv worker does (the steps before are skipped, never done), else at the
    first step of the round it lost."""
    c.down[w] = False
    clock = c.clock[w]
    for ctrl in c.controllers:
        ctrl.join(w)
        clock = max(clock, ctrl.counted_from(w) or 0, ctrl.next_clock(w))
    c.clock[w] = clock
    if from_clock and clock * c.h > c.done[w]:
        first = min(clock * c.h, c.steps)
        c.rec.skipped_steps += first - c.done[w]
        c.done[w] = first
        if first >= c.steps:  # nothing left for it: it ends as it joins
            c.finish(w, t)
            return
    c.rejoining[w] = True
    c.pushed_at[w], c.replies[w], c.held[w], c.reply_at[w] = t, c.s, 0.0, t
    for s, ctrl in enumerate(c.controllers):
        ctrl.expect(w, clock)
        heapq.heappush(c.waiting[s], (clock, w, t, c.gen[w]))
    for s in range(c.s):
        c.release(s, t + c.latency)
