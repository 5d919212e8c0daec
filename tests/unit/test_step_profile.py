"""The step profile's readings (experiments/bench/step_profile.py): a process's CPU from /proc and the run's
shards and workers found below its launcher, on processes started here (no psrv run: the bench runs one)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from psrv.experiments.bench.step_profile import _cpu, _processes


def test_cpu_counts_this_process_work():
    before = _cpu(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    assert _cpu(os.getpid()) - before >= 0.1


def test_the_shards_and_workers_below_the_launcher_are_found_by_role_and_nothing_else():
    sleep = "import time; time.sleep(30)"
    started = [subprocess.Popen([sys.executable, "-c", sleep, "-m", "psrv.cli", *role])
               for role in (("worker",), ("serve",), ("worker",), ("top",))]
    try:
        deadline = time.monotonic() + 10
        while len(found := _processes(os.getpid())) < 3 and time.monotonic() < deadline:  # each one's exec
            time.sleep(0.05)
        workers = sorted(p.pid for p in (started[0], started[2]))
        assert found == {"shard-0": started[1].pid, "worker-0": workers[0], "worker-1": workers[1]}, found
    finally:
        for p in started:
            p.kill()
            p.wait()
