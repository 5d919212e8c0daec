"""One all-reduce rank's step timing: the emulated faults at the end of compute, then the wait for the
other ranks, then the gradient collective.

A step's row (psrv/client/step_timer.py, as psrv.Worker's): compute_seconds = from the previous step's end
through forward + backward until the gradients are ready + emulated compute;
wait_seconds = the wait for the slowest rank to finish its compute; communication_seconds = the rest:
the emulated net delay, the gradient collective and the optimizer step (the PS analogue is the server
applying the update inside push_pull). gloo and nccl cannot tell waiting from transfer inside one
collective, so the wait is found one of two ways:
- by default, after the run (`split_wait`, psrv/client/collective.py): a step's time from compute end
  to step end beyond the fastest rank's at that step, which is what a rank spent waiting for the last
  one to arrive (no cost per step; the ranks exchange their rows once, at the end);
- with --wait-barrier, measured: the time in a barrier on a gloo group of its own just before the
  gradient collective (one more small collective per step, which costs throughput: docs/benchmarks.md).
It also counts what really happened: gradient collectives issued at a step's end (`reduced`) and
optimizer steps that ran (`updates`), and tells the step beacon (psrv/step_beacon.py) what the rank is in:
forward and backward from `start`, then the barrier and the gradient collective (`collective`, its name)
from `compute_done`, so that a rank hanging there is named with it by the launcher's stall watch."""
from __future__ import annotations

import time

import torch.distributed as dist

from psrv.step_beacon import StepBeacon
from psrv.client.step_timer import StepTimer
from psrv.workers.faults import FaultInjector

COMPUTE = "forward and backward"


class StepClock:
    def __init__(self, faults: FaultInjector, *, barrier_group=None, beacon: StepBeacon | None = None,
                 collective: str = "the gradient collective"):
        self.faults = faults
        self.barrier_group = barrier_group  # None: no barrier, wait_seconds stays 0
        self.beacon = beacon if beacon is not None else StepBeacon(None)
        self.collective = collective
        self.timer = StepTimer()  # restarted where the loop begins (psrv/client/step_timer.py)
        self.step = 0
        self.waited = 0.0
        self.reduced = 0
        self.updates = 0

    @property
    def compute_end(self) -> float | None:
        return self.timer.compute_end

    def start(self, step: int) -> None:
        self.step, self.waited = step, 0.0
        self.beacon.working(COMPUTE)

    def compute_done(self, *, sync: bool = True) -> None:
        """Called once per step when this rank's gradients are ready, before they are reduced: the
        emulated compute, then (`sync`: a collective follows) the net delay and the timed barrier."""
        if self.timer.compute_end is not None:
            return
        self.faults.compute(self.step, self.timer.computing())
        self.timer.computed()
        if not sync:
            return
        self.faults.before_send()
        if self.barrier_group is not None:
            t = time.perf_counter()
            self.beacon.waiting("barrier before the gradient collective (--wait-barrier)")
            dist.barrier(group=self.barrier_group)
            self.waited = time.perf_counter() - t
        self.beacon.waiting(self.collective)

    def reduce_done(self, fut):
        """A `.then` callback on a step's last gradient collective: count it, pass its value on."""
        self.reduced += 1
        return fut.value()

    def stepped(self, optimizer, args, kwargs) -> None:
        """An optimizer step post-hook: count the step that ran."""
        self.updates += 1

    def row(self, t_end: float) -> dict[str, float]:
        """The step's compute, communication and wait seconds (t_end: the step's end, perf_counter)."""
        return self.timer.row(waited=self.waited, end=t_end)
