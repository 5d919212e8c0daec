"""psrv run's nemesis kills of workers, simulated (`psrv simulate --nemesis SPEC [--restart-workers N]`;
docs/simulator.md, "Kills on a schedule").

The schedule is psrv run's own text and its faults are drawn by the launcher's own code
(experiments/launcher/nemesis/schedule.py), so a seed kills the same ranks in the same order as a real run; a fault's
seconds count from the simulation's start (a real run's, from worker 0's first step). Only kills of workers are
simulated. A kill at t, as a SIGKILL of a worker process:
- voids the worker's pending event and held pulls and loses the steps of its round not yet answered
  (failures.py `fail`); the shards are not told: a sync barrier or a quorum still counts the dead worker; the
  killed life's steps leave the sampled rows (steps.csv), as a killed psrv worker writes no record;
- with `--restart-workers N` (at most N restarts per rank, as psrv run's): its new life says HELLO `--fail-down`
  seconds later; the shards then let the old life go (`leave`) and take the new one in (`join`), and it starts at the
  first step of the clock they hand it, as a restarted psrv worker does: the steps between are never done;
- without a restart left: the shards let it go after their worker timeout (`--worker-timeout`), and it does no more
  steps.
A kill of a worker that has ended is not done (as the nemesis's "had ended already"); a kill while it restarts
restarts it again."""
from __future__ import annotations

import heapq
import itertools

from psrv.experiments.launcher.nemesis.schedule import Timeline
from psrv.experiments.simulate.failures import fail, rejoin

KILL, BACK, GONE = 0, 1, 2


class Kills:
    """The kills of `schedule` as events in simulated time: `heap` holds (time, seq, kind, worker, life); the
    cluster's loop calls `next` when the earliest comes first (as it does failures.py's Failures)."""

    def __init__(self, schedule: str, *, workers: int, seed: int, down: float, restarts: int, worker_timeout: float):
        self.down, self.restarts, self.timeout = down, restarts, worker_timeout
        self.planned = Timeline(schedule, seed=seed, servers=1, workers=workers).in_time_order()
        self.seq = itertools.count()
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.life = [0] * workers          # bumped by each kill: a BACK or GONE of an earlier life is void
        self.restarted = [0] * workers
        self.left = [False] * workers      # the shards let the current dead life go already
        self.began = [0.0] * workers       # when each worker's current life began
        self.not_done = 0
        self._plan()

    def _plan(self) -> None:
        p = next(self.planned, None)
        if p is not None:
            heapq.heappush(self.heap, (p.at.seconds, next(self.seq), KILL, p.targets[0].index, 0))

    def next(self, c) -> None:
        t, _, kind, w, life = heapq.heappop(self.heap)
        if kind == KILL:
            if not any(c.done[v] < c.steps or c.down[v] for v in range(c.n) if not self._gone(v)):
                return  # every worker has ended: the run is over, and so is its schedule
            self._plan()
            self._kill(c, w, t)
        elif life == self.life[w] and kind == GONE:
            self.left[w] = True
            c.leave(w, t)
        elif life == self.life[w]:
            if not self.left[w]:
                c.leave(w, t)  # the new life's HELLO: the shards let the old one go, then take it in
            self.began[w] = t
            rejoin(c, w, t, from_clock=True)

    def _gone(self, w: int) -> bool:
        return self.restarted[w] > self.restarts

    def _kill(self, c, w: int, t: float) -> None:
        if self._gone(w) or (c.done[w] >= c.steps and not c.down[w]):
            self.not_done += 1  # it has ended: nothing to kill
            return
        self.life[w] += 1
        self.restarted[w] += 1
        self.left[w] = False
        restart = not self._gone(w)
        c.rec.kills.append({"t": round(t, 3), "rank": w, "restarted": restart})
        if not c.down[w]:
            fail(c, w, t, leave=False)
        if w < c.sample:  # a killed life writes no record: none of its steps are in steps.csv, as in a real run's
            c.rec.rows[:] = [row for row in c.rec.rows if row["worker"] != w or row["wall_time"] < self.began[w]]
        if self.timeout < self.down or not restart:
            heapq.heappush(self.heap, (t + self.timeout, next(self.seq), GONE, w, self.life[w]))
        if restart:
            heapq.heappush(self.heap, (t + self.down, next(self.seq), BACK, w, self.life[w]))
            return
        c.rec.skipped_steps += c.steps - c.done[w]  # left behind: its remaining steps are never done
        c.done[w] = c.steps
