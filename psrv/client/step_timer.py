"""A step's seconds as every worker's step row counts them (psrv.Worker, the all-reduce worker, and the shipped
PS and all-reduce loops), so that one mode's compute is measured as another's:

- compute: from the previous step's end (the first: from the timer's start) to this step's compute end (the
  gradient ready: a `step()` call, or an all-reduce rank's first gradient collective), less the time taken off
  the clock in between (an evaluation);
- wait: the part of the rest spent waiting for other workers (a shard's barrier, a rank's barrier), as measured;
- communication: the rest, up to the step's end (the push, the pull, the collective, the server's apply).
"""
from __future__ import annotations

import time


class StepTimer:
    def __init__(self, began: float | None = None):
        self._began = time.perf_counter() if began is None else began
        self._computed: float | None = None
        self._off = 0.0

    @property
    def compute_end(self) -> float | None:
        """When this step's compute ended (perf_counter), None while it goes on."""
        return self._computed

    def computing(self) -> float:
        """The seconds of compute this step so far (an emulated slowdown scales them)."""
        return max(0.0, time.perf_counter() - self._began - self._off)

    def computed(self, at: float | None = None) -> None:
        """This step's compute ended (`at`, else now); the first call of a step counts."""
        if self._computed is None:
            self._computed = time.perf_counter() if at is None else at

    def off_clock(self, seconds: float) -> None:
        """`seconds` between steps that are no step's compute (an evaluation)."""
        self._off += seconds

    def row(self, *, waited: float = 0.0, end: float | None = None) -> dict[str, float]:
        """The step's compute_seconds, communication_seconds and wait_seconds, it having ended `end` (else now),
        `waited` of its time spent waiting for others; the next step begins there."""
        end = time.perf_counter() if end is None else end
        computed = end if self._computed is None else self._computed
        after = max(0.0, end - computed)
        row = {"compute_seconds": max(0.0, computed - self._began - self._off),
               "communication_seconds": max(0.0, after - waited), "wait_seconds": min(max(0.0, waited), after)}
        self.restart(end)
        return row

    def restart(self, at: float | None = None) -> None:
        """The next step's compute begins `at` (else now): where control went back to the training loop."""
        self._began = time.perf_counter() if at is None else at
        self._computed, self._off = None, 0.0
