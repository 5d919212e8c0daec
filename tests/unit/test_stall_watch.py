"""The stall watch's parts: the bound's rule, the step beacon a rank keeps, which rank is named, and the
watch itself over real processes (sleep, no torch) whose beacons the test writes, on a clock it moves."""
import signal
import time
from pathlib import Path

import pytest

from psrv.experiments.launcher.cluster import Cluster, RunFailed
from psrv.experiments.launcher.stall import (CAP, FLOOR, RankState, StallWatch, beacon_path, culprit, process_stopped,
                                    stall_bound)
from psrv.step_beacon import OFF_CLOCK, WAITING, WORKING, Beacon, StepBeacon, read_beacon


def test_the_bound_is_five_times_the_slowest_step_within_ten_and_sixty_seconds():
    assert stall_bound(0.0) == CAP == 60.0           # before the first step
    assert stall_bound(0.004) == FLOOR == 10.0       # millisecond steps: the floor
    assert stall_bound(3.0) == 15.0                  # 5x
    assert stall_bound(30.0) == 60.0                 # at most a minute
    assert stall_bound(0.004, fixed=2.5) == stall_bound(30.0, fixed=2.5) == 2.5  # --stall-timeout
    assert stall_bound(0.0, fixed=2.5) == 2.5


def test_a_beacon_says_the_steps_the_slowest_and_what_the_rank_is_in(tmp_path):
    path = tmp_path / "worker-0.beat"
    assert read_beacon(path) is None
    beacon = StepBeacon(path)
    assert read_beacon(path) == Beacon(beacon.pid, 0, 0.0, WORKING, "start-up", "")
    beacon.working("forward and backward")
    beacon.waiting("all_reduce of the gradients (DDP)")
    beacon.stepped(0.25)
    beacon.working("forward and backward")
    beacon.stepped(0.125)
    assert read_beacon(path) == Beacon(beacon.pid, 2, 0.25, WORKING, "forward and backward",
                                       "all_reduce of the gradients (DDP)")
    beacon.off_clock("evaluation")
    assert read_beacon(path).kind == OFF_CLOCK
    path.write_bytes(b"short")                       # not a beacon
    assert read_beacon(path) is None
    quiet = StepBeacon(None)                         # outside psrv run: writes nothing
    quiet.waiting("all_reduce")
    quiet.stepped(1.0)
    assert quiet.steps == 1


def _state(rank, steps, kind=WAITING, *, stopped=False, quiet_since=0.0):
    return RankState(rank, Beacon(100 + rank, steps, 0.1, kind, "phase", ""), stopped, quiet_since)


def test_the_named_rank_is_the_one_the_others_wait_for():
    waiting = [_state(0, 41), _state(1, 41), _state(2, 41)]
    assert culprit(waiting).rank == 0                                     # a deadlock: the lowest rank
    assert culprit(waiting + [_state(3, 41, WORKING)]).rank == 3          # never arrived at the collective
    assert culprit(waiting + [_state(3, 40)]).rank == 3                   # fewest steps
    assert culprit([_state(0, 41, quiet_since=5.0), _state(1, 41, quiet_since=2.0)]).rank == 1  # quiet longest
    stopped = _state(2, 41, stopped=True)                                 # SIGSTOP beats everything
    assert culprit([_state(0, 40, WORKING), _state(1, 41), stopped]).rank == 2


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ranks(tmp_path):
    """Two live processes as ranks 0 and 1 of a cluster (sleep: the watch reads their state from /proc)."""
    cluster = Cluster(tmp_path)
    names = [f"worker-{rank}" for rank in range(2)]
    for name in names:
        cluster.start(name, ["sleep", "60"])
    yield cluster, names
    for proc in cluster.procs.values():
        proc.send_signal(signal.SIGCONT)
    cluster.stop()


def _beacons(out, count=2):
    return [StepBeacon(Path(beacon_path(out).replace("{rank}", str(rank)))) for rank in range(count)]


def test_the_watch_ends_the_run_naming_the_stopped_rank_and_kills_it(ranks, tmp_path):
    cluster, names = ranks
    clock = _Clock()
    watch = StallWatch(cluster, names, tmp_path, clock=clock)
    first, second = _beacons(tmp_path)
    for beacon in (first, second):
        beacon.waiting("all_reduce of the gradients (DDP)")
        beacon.stepped(0.5)                          # slowest step 0.5 s: the bound is 10 s
    watch.check()
    second.working("forward and backward")
    cluster.procs["worker-1"].send_signal(signal.SIGSTOP)
    _until(lambda: process_stopped(cluster.procs["worker-1"].pid))
    clock.now += 9.9
    watch.check()                                    # within the bound: nothing said
    clock.now += 0.2
    with pytest.raises(RunFailed) as failed:
        watch.check()
    line = str(failed.value)
    assert "\n" not in line
    assert line.startswith("rank 1 made no step for 10.1 s (in forward and backward, after 1 steps; the last "
                           "collective it entered: all_reduce of the gradients (DDP); its process is stopped "
                           "(SIGSTOP)); rank 0 waits in all_reduce of the gradients (DDP), after 1 steps; "
                           "the bound: 10 s: 5x the slowest step so far, 0.50 s"), line
    assert cluster.procs["worker-1"].wait(5) == -signal.SIGKILL       # killed, though stopped
    assert cluster.procs["worker-0"].poll() is None                   # the rest: Cluster.stop, by PID


def test_a_step_or_an_evaluation_starts_the_quiet_time_afresh(ranks, tmp_path):
    cluster, names = ranks
    clock = _Clock()
    watch = StallWatch(cluster, names, tmp_path, fixed=3.0, clock=clock)
    clock.now += 100.0
    watch.check()                                    # no beacons yet: the ranks still start
    first, second = _beacons(tmp_path)
    watch.check()
    for _ in range(3):                               # steps keep it going
        clock.now += 2.5
        first.stepped(0.1)
        second.stepped(0.1)
        watch.check()
    first.off_clock("evaluation")                    # rank 0 evaluates for a long time; rank 1 waits
    second.waiting("barrier after rank 0's evaluation")
    clock.now += 50.0
    watch.check()
    first.waiting("barrier after rank 0's evaluation")
    clock.now += 2.9
    watch.check()
    clock.now += 0.2
    with pytest.raises(RunFailed, match=r"^rank 0 made no step for 3\.1 s \(in barrier after rank 0's "
                                        r"evaluation, after 3 steps\); rank 1 waits in barrier .*the bound: 3 s "
                                        r"\(--stall-timeout\)"):
        watch.check()


def _until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_stall_timeout_is_an_all_reduce_setting_a_script_may_use_too():
    from psrv.config import ConfigError, RunConfig, from_dict
    from psrv.experiments.launcher.script import check_script_run
    with pytest.raises(ConfigError, match=r"^allreduce\.stall_timeout: watches the all-reduce modes' ranks; "
                                          r"'sync' has servers"):
        from_dict(RunConfig, {"mode": "sync", "allreduce": {"stall_timeout": 5.0}})
    ddp = from_dict(RunConfig, {"mode": "ddp", "allreduce": {"stall_timeout": 5.0}})
    check_script_run(ddp, {"allreduce.stall_timeout", "mode"})             # the launcher watches a script's ranks
    with pytest.raises(ValueError, match=r"^--wait-barrier: not used with --script"):
        check_script_run(ddp.replace(allreduce=ddp.allreduce.replace(wait_barrier=True)), {"allreduce.wait_barrier"})
