"""An all-reduce run whose rank hangs ends within the stall bound (experiments/launcher/stall.py), in one line naming
that rank and the collective, exit 1, with no process left: one rank stopped with SIGSTOP partway, in the
shipped DDP ranks (the default bound) and in a script's psrv.Worker ranks (--stall-timeout)."""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from psrv.step_beacon import read_beacon
from tests.helpers import ROOT, psrv_argv
from tests.integration.test_interrupts import _alive, _children, _reap

# these walk the launcher's process tree, its fork server in it: no zygote (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("own_fork_server")

SCRIPT = Path(__file__).with_name("script_loop.py")


def _stop_rank_partway(tmp_path: Path, victim: int, *args: str) -> tuple[int, float, str]:
    """`psrv run ARGS` until rank `victim` has made 20 steps, then SIGSTOP to it: (the launcher's exit code,
    seconds from the stop to its end, its stderr); every process it started is gone by then, or the test fails."""
    out = tmp_path / "run"
    with open(tmp_path / "stderr", "w") as stderr:
        launcher = subprocess.Popen(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--out", str(out),
                                              *args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                    start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    children: dict[int, str] = {}
    try:
        beacon = _wait_for_steps(out / f"worker-{victim}.beat", 20, launcher, tmp_path / "stderr")
        children = _children(launcher.pid)
        assert len(children) == 2, children                         # the two ranks
        os.kill(beacon.pid, signal.SIGSTOP)                         # the rank's own process (its beacon's pid)
        stopped = time.monotonic()
        code = launcher.wait(100)
        took = time.monotonic() - stopped
        assert [pid for pid, started in children.items() if _alive(pid, started)] == []
    finally:
        _reap(launcher, children)
    return code, took, (tmp_path / "stderr").read_text()


def _wait_for_steps(path: Path, steps: int, proc: subprocess.Popen, log: Path, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        beacon = read_beacon(path)
        if beacon is not None and beacon.steps >= steps:
            return beacon
        assert proc.poll() is None, f"exited ({proc.returncode}) before {steps} steps:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"fewer than {steps} steps in {timeout}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def _the_line(err: str) -> str:
    assert "Traceback" not in err, err
    failed = [line for line in err.splitlines() if line.startswith("psrv run failed:")]
    assert len(failed) == 1, err
    return failed[0]


@pytest.mark.timeout(240)
def test_a_stopped_ddp_rank_ends_the_run_within_the_default_bound(tmp_path):
    # stays slow: it waits out the default bound (a few times the slowest step, at least seconds), the thing it checks
    code, took, err = _stop_rank_partway(tmp_path, 1, "--mode", "ddp", "--workers", "2", "--steps", "100000",
                                         "--compute-ms", "5")
    line = _the_line(err)
    said = re.fullmatch(r"psrv run failed: rank 1 made no step for ([\d.]+) s \(in (forward and backward|"
                        r"all_reduce of the gradients \(DDP\)), after \d+ steps.*; its process is stopped "
                        r"\(SIGSTOP\)\); rank 0 waits in all_reduce of the gradients \(DDP\), after \d+ steps; "
                        r"the bound: (\d+) s: 5x the slowest step so far, .*", line)
    assert said and code == 1, (code, line)
    quiet, bound = float(said.group(1)), float(said.group(3))
    assert 10 <= bound <= 60 and bound <= quiet < bound + 3
    assert bound - 1 < took < bound + 10, (took, line)            # the bound, then the others stopped by PID


@pytest.mark.timeout(240)
def test_a_stopped_script_rank_ends_the_run_within_its_stall_timeout(tmp_path):
    code, took, err = _stop_rank_partway(tmp_path, 0, "--mode", "ddp", "--workers", "2", "--stall-timeout", "5",
                                         "--script", str(SCRIPT), "1000", str(tmp_path / "final.pt"))
    line = _the_line(err)
    said = re.fullmatch(r"psrv run failed: rank 0 made no step for ([\d.]+) s \(in (the script's own code "
                        r"between steps|all_reduce of gradients \(AllReduceWorker.step\)), after \d+ steps.*; "
                        r"its process is stopped \(SIGSTOP\)\); rank 1 waits in all_reduce of gradients "
                        r"\(AllReduceWorker.step\), after \d+ steps; the bound: 5 s \(--stall-timeout\); .*", line)
    assert said and code == 1, (code, line)
    assert 5 <= float(said.group(1)) < 6
    assert 4 < took < 15, (took, line)
