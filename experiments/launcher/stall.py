"""The stall watch over a run's all-reduce ranks: a rank that makes no step for a bound ends the run, in one
line naming it and the collective it is in, instead of the run hanging until the collective's timeout (10 min
for the shipped ranks) or the run's (30 min). A gloo deadlock once sat at one step for 6 minutes with nothing
said.

Each rank keeps a step beacon (psrv/step_beacon.py, DIR/worker-R.beat): its steps, its slowest step, and
what it is in now (forward and backward, a named collective, or off the clock). The launcher reads them at
every tick of its wait (0.2 s) and notes when each rank's step count last changed.

The bound (`stall_bound`): allreduce.stall_timeout (--stall-timeout) seconds where given; else 5x the
slowest step any rank has made so far, at least 10 s and at most 60 s, and 60 s before the first step.
5x, because a step's time varies (a straggler, garbage collection, the OS's scheduling) and the slowest
step seen, the first one included (it builds DDP's buckets), is already a generous yardstick; at least 10 s,
so that a loaded machine's pause cannot end a run of millisecond steps; at most a minute, so a hang is said
within one.

Off the clock is not a stall: while a rank evaluates or loads its job (and is not stopped), or has not yet
written its beacon (it starts: imports torch, loads a script's data, meets the others at the rendezvous,
which has its own timeout), the others wait for it by design, and every rank's quiet time starts afresh.

Which rank is named (`culprit`): the others wait for it. A rank stopped by a signal (SIGSTOP) first; then
one that is not in a collective (it never arrived at the one the others wait in); then the one with the
fewest steps, quiet the longest. It is killed with SIGKILL, as is any other stopped rank (SIGTERM does not
reach a stopped process); the launcher then stops the rest by PID (Cluster.stop).

Only with the local scheduler (emulated hosts included): the beacons are shared through the page cache of
one host, which a network filesystem between SLURM nodes does not promise.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from psrv.step_beacon import OFF_CLOCK, WAITING, Beacon, read_beacon

from psrv.experiments.launcher.cluster import Cluster, RunFailed

FACTOR, FLOOR, CAP = 5.0, 10.0, 60.0  # the default bound: FACTOR x the slowest step, within [FLOOR, CAP] s


def beacon_path(out: Path | str) -> str:
    """Where each all-reduce rank keeps its step beacon ('{rank}': its rank, filled in by the rank)."""
    return f"{out}/worker-{{rank}}.beat"


def stall_bound(slowest_step: float, fixed: float = 0.0) -> float:
    """Seconds a rank may go without a step: `fixed` where given (> 0); else FACTOR x `slowest_step` (the
    slowest step any rank has made so far; 0 before the first), at least FLOOR and at most CAP, and CAP
    before the first step."""
    if fixed > 0:
        return fixed
    if slowest_step <= 0:
        return CAP
    return min(CAP, max(FLOOR, FACTOR * slowest_step))


@dataclass
class RankState:
    """What the watch knows of one live rank: its beacon as last read (None: none yet), whether its process
    is stopped by a signal, and since when (the watch's clock) its step count has not changed."""
    rank: int
    beacon: Beacon | None
    stopped: bool
    quiet_since: float


def culprit(ranks: list[RankState]) -> RankState:
    """The rank the others wait for: a stopped one; else one not in a collective; else the one with the
    fewest steps, quiet the longest; the lowest rank breaks ties."""
    def order(state: RankState):
        beacon = state.beacon
        in_collective = beacon is not None and beacon.kind == WAITING
        return (not state.stopped, in_collective, beacon.steps if beacon else -1, state.quiet_since, state.rank)
    return min(ranks, key=order)


class StallWatch:
    """Watches the ranks `names` (rank R is names[R], a process of `cluster`) through their beacons in
    `out`; `check()`, called at each tick of the launcher's wait, raises RunFailed once one has stalled.
    `fixed`: allreduce.stall_timeout (0: the default bound). `clock`: monotonic seconds (tests pass their own)."""

    def __init__(self, cluster: Cluster, names: list[str], out: Path, *, fixed: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.cluster, self.names, self.fixed, self.clock = cluster, names, fixed, clock
        self.paths = [Path(beacon_path(out).replace("{rank}", str(rank))) for rank in range(len(names))]
        started = clock()
        self.states = [RankState(rank, None, False, started) for rank in range(len(names))]
        self.slowest = 0.0

    def check(self) -> None:
        """Read the live ranks' beacons; RunFailed, in one line, once the rank they wait for has made no
        step for the bound (that rank and any stopped one killed first)."""
        now, live, paused = self.clock(), [], False
        for state, name in zip(self.states, self.names):
            proc = self.cluster.procs[name]
            if proc.poll() is not None:  # ended: the cluster's check says whether it failed
                continue
            beacon = read_beacon(self.paths[state.rank]) or state.beacon
            if beacon is not None and beacon.steps != (state.beacon.steps if state.beacon else 0):
                state.quiet_since = now
            state.beacon, state.stopped = beacon, process_stopped(proc.pid)
            if beacon is not None:
                self.slowest = max(self.slowest, beacon.slowest)
                paused = paused or (beacon.kind == OFF_CLOCK and not state.stopped)
            live.append(state)
        # one works off the clock, or still starts (the rendezvous has its own timeout): the others wait for it
        starting = any(state.beacon is None and not state.stopped for state in live)
        if paused or starting:
            for state in self.states:
                state.quiet_since = now
            return
        if not live:
            return
        rank = culprit(live)
        bound = stall_bound(self.slowest, self.fixed)
        quiet = now - rank.quiet_since
        if quiet < bound:
            return
        for state in live:
            if state is rank or state.stopped:
                self.cluster.procs[self.names[state.rank]].kill()  # SIGKILL, which reaches a stopped process
        raise RunFailed(stall_line(rank, live, quiet=quiet, bound=self._bound_text(bound), out=self.cluster.out))

    def _bound_text(self, bound: float) -> str:
        if self.fixed > 0:
            return f"{bound:g} s (--stall-timeout)"
        if self.slowest <= 0:
            return f"{bound:g} s before the first step (--stall-timeout sets it)"
        return (f"{bound:.0f} s: {FACTOR:g}x the slowest step so far, {self.slowest:.2f} s, at least {FLOOR:g} s and "
                f"at most {CAP:g} s (--stall-timeout sets it)")


def stall_line(rank: RankState, live: list[RankState], *, quiet: float, bound: str, out: Path) -> str:
    """The run's failure in one line: the rank, where it is, what the others wait in, the bound."""
    others = [s for s in live if s is not rank]
    said = [f"rank {s.rank} {where(s, short=True)}" for s in others]
    return (f"rank {rank.rank} made no step for {quiet:.1f} s ({where(rank)}){'; ' if said else ''}{'; '.join(said)}; "
            f"the bound: {bound}; every rank stopped; their logs: {out}/worker-R.log")


def where(state: RankState, *, short: bool = False) -> str:
    """What a rank is in, from its beacon: 'in all_reduce of the gradients (DDP), after 42 steps'."""
    beacon = state.beacon
    stopped = "; its process is stopped (SIGSTOP)" if state.stopped else ""
    if beacon is None:
        return f"still starting{stopped}"
    done = f"after {beacon.steps} steps"
    if beacon.kind == WAITING:
        return f"{'waits ' if short else ''}in {beacon.phase}, {done}{stopped}"
    last = f"; the last collective it entered: {beacon.collective}" if beacon.collective and not short else ""
    return f"{'is ' if short else ''}in {beacon.phase}, {done}{last}{stopped}"


def process_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal (SIGSTOP, SIGTSTP) or a tracer, from /proc (Linux)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = text.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] in ("T", "t")
