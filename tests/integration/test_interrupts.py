"""Ctrl-C and SIGTERM, as real processes on 127.0.0.1: a worker leaves its shards and keeps its rows,
`psrv run` stops its processes in order and writes what ran, marked incomplete.

Exit codes are the shell's for a process a signal stopped: 130 for SIGINT, 143 for SIGTERM.
"""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psrv.client.admin import admin_request
from psrv.protocol import MsgType
from tests.helpers import ROOT, psrv_argv

# these walk the launcher's process tree, its fork server in it: no zygote (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("own_fork_server")

STEPS = 400           # long enough that the other worker is still training when the first one stops
TIMEOUT = "60"        # --worker-timeout: a worker lost to silence would stall the barrier this long


def _progress(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _wait_for_steps(path: Path, steps: int, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while _progress(path) < steps:
        assert proc.poll() is None, f"exited ({proc.returncode}) before {steps} steps:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"fewer than {steps} steps in {timeout}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


SIGNALS = ((1, signal.SIGINT, 130), (2, signal.SIGTERM, 143))  # (rank, signal, exit code), in the order sent


@pytest.mark.timeout(240)
def test_an_interrupted_worker_leaves_and_keeps_its_rows(procs, tmp_path):
    """One sync cluster, three workers: rank 1 gets SIGINT, then rank 2 SIGTERM (one run for both
    signals, not one each: each victim is checked on its own, and worker 0 goes on alone after both)."""
    # stays slow (4 processes): a signal and what a process does with it need real processes
    server, address = procs.server("server", "--workers", "3", "--mode", "sync", "--worker-timeout", TIMEOUT,
                                   "--out", str(tmp_path / "server.json"), "--log-level", "WARNING")
    common = ("--servers", address, "--world-size", "3", "--steps", str(STEPS), "--compute-ms", "10",
              "--log-level", "WARNING")
    others = procs.start("worker-0", "worker", "--rank", "0", "--out", str(tmp_path / "worker-0.json"), *common)
    victims = {rank: procs.start(f"worker-{rank}", "worker", "--rank", str(rank),
                                 "--out", str(tmp_path / f"worker-{rank}.json"),
                                 "--progress-file", str(tmp_path / f"worker-{rank}.progress"), *common)
               for rank, _, _ in SIGNALS}
    for rank, victim in victims.items():
        _wait_for_steps(tmp_path / f"worker-{rank}.progress", 20, victim, tmp_path / f"worker-{rank}.log")

    sent, done = time.monotonic(), {}
    for rank, signum, code in SIGNALS:
        victims[rank].send_signal(signum)
        assert procs.wait(victims[rank], timeout=5) == code
        # The shard took it out of the active set at once: by LEAVE, since silence would take 60 s.
        assert others.poll() is None, "worker 0 finished before the check; raise STEPS"
        stats = admin_request(address, MsgType.STATS)
        still = [0] + [r for r, _, _ in SIGNALS if r > rank]
        assert stats["active"] == still and stats["lost_workers"] == [], stats

        lines = procs.log(f"worker-{rank}").splitlines()            # its stdout and stderr
        assert len(lines) == 1 and "Traceback" not in procs.log(f"worker-{rank}"), lines
        done[rank] = int(re.search(rf"worker {rank}: interrupted at step (\d+); leaving$", lines[0]).group(1))
        record = json.loads((tmp_path / f"worker-{rank}.json").read_text())
        assert record["interrupted"] is True and record["steps_done"] == done[rank] == record["pushes"]
        assert 20 <= done[rank] < STEPS
        assert [r["step"] for r in record["step_log"]] == list(range(done[rank]))

    # The other worker goes on alone, never waiting anywhere near the worker timeout.
    assert procs.wait(others, timeout=120) == 0
    took = time.monotonic() - sent
    steps = json.loads((tmp_path / "worker-0.json").read_text())["step_log"]
    waits = sorted(r["wait_seconds"] for r in steps)[-3:]
    assert len(steps) == STEPS and waits[-1] < 10, (took, waits)
    assert took < float(TIMEOUT), (took, waits)           # it ended before a timeout could have freed it
    assert procs.wait(server, timeout=30) == 0                # every worker left: the shard ends
    shard = json.loads((tmp_path / "server.json").read_text())
    assert shard["lost_workers"] == [] and shard["version"] == STEPS, shard
    for rank in victims:                                      # its push in flight may have arrived
        assert shard["clocks"][str(rank)] - done[rank] in (0, 1), (rank, shard["clocks"], done)
    assert shard["pushes"] - STEPS - sum(done.values()) in (0, 1, 2)


def _children(pid: int, *, forkserver: bool = False) -> dict[int, str]:
    """{pid: start time} of the processes a launcher `pid` started, from /proc: its children, where one is the
    run's fork server (experiments/launcher/forkserver.py) the processes it forked instead (`forkserver`: it too)."""
    found = {}
    for child, started in _direct(pid).items():
        if _is_forkserver(child):
            found.update(_direct(child))
            if forkserver:
                found[child] = started
        else:
            found[child] = started
    return found


def _direct(pid: int) -> dict[int, str]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and int(stat[1]) == pid:
                found[int(entry)] = stat[19]
    return found


def _is_forkserver(pid: int) -> bool:
    try:
        return b"psrv.cli.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _stat(pid: int) -> list[str] | None:
    """/proc/pid/stat's fields after the command name (state, ppid, ...); None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2:].split()


def _alive(pid: int, started: str) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[19] == started and stat[0] != "Z"


def _reap(launcher: subprocess.Popen, children: dict[int, str]) -> None:
    """A test's cleanup: the launcher killed if it still runs, and each of its children still alive."""
    if launcher.poll() is None:
        launcher.kill()
        launcher.wait()
    for pid, started in children.items():
        if _alive(pid, started):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_an_interrupted_run_writes_what_ran_and_leaves_no_process(tmp_path):
    out = tmp_path / "run"
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        launcher = subprocess.Popen(psrv_argv("run", "--mode", "sync", "--workers", "2", "--servers", "2",
                                              "--steps", "3000", "--compute-ms", "10", "--worker-timeout",
                                              TIMEOUT, "--no-progress", "--out", str(out)),
                                    cwd=ROOT, stdout=stdout, stderr=stderr, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
    children: dict[int, str] = {}
    try:
        _wait_for_steps(out / "worker-0.progress", 20, launcher, tmp_path / "stderr")
        children = _children(launcher.pid)
        assert len(children) == 4, children                   # 2 servers, 2 workers
        children = _children(launcher.pid, forkserver=True)   # all must be gone: the fork server too
        sent = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(30) == 130
        assert time.monotonic() - sent < 15
        assert [pid for pid, started in children.items() if _alive(pid, started)] == []
    finally:
        _reap(launcher, children)

    err = (tmp_path / "stderr").read_text()
    assert "Traceback" not in err, err
    said = re.search(r"^interrupted: wrote the (\d+) steps that ran to (\S+) \(incomplete\)$", err, re.M)
    assert said and said.group(2) == str(out), err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["interrupted"] is True
    rows = _rows(out / "steps.csv")
    assert summary["steps_done"] == len(rows) == int(said.group(1)) >= 40
    assert len(rows) < 2 * 3000 and {r["worker"] for r in rows} == {"0", "1"}
    for rank in (0, 1):                                       # each worker left and wrote its record
        record = json.loads((out / f"worker-{rank}.json").read_text())
        assert record["interrupted"] is True and "Traceback" not in (out / f"worker-{rank}.log").read_text()
    assert summary["lost_workers"] == []


LIBRARY_USER = """
import json, signal, sys
from psrv.config import WorkerConfig, from_dict
from psrv.workers.loop import TrainingInterrupted, train
cfg = from_dict(WorkerConfig, {"servers": [sys.argv[1]], "rank": 0, "world_size": 1,
                               "job": {"steps": 100000}, "faults": {"compute_ms": 10}})
try:
    train(cfg, progress=lambda step: step == 20 and print("20 steps", flush=True))
except TrainingInterrupted as exc:
    print(json.dumps({"steps_done": exc.record["steps_done"], "rows": len(exc.record["step_log"]),
                      "default_handler": signal.getsignal(signal.SIGINT) is signal.default_int_handler}))
"""


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT at its default in the user's process, as in a terminal. A process inherits an ignored
    SIGINT, and Python then installs no KeyboardInterrupt for it: pytest started in the background
    (`make test &`, where the shell ignores SIGINT) made the user's process deaf to Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(120)
def test_ctrl_c_in_a_library_users_train_leaves_and_hands_back_the_rows(procs, tmp_path):
    server, address = procs.server("server", "--workers", "1", "--mode", "sync", "--worker-timeout", TIMEOUT,
                                   "--log-level", "WARNING")
    user = subprocess.Popen([sys.executable, "-c", LIBRARY_USER, address], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        assert user.stdout.readline() == "20 steps\n"     # its own print, from the progress callback
        user.send_signal(signal.SIGINT)
        out, err = user.communicate(timeout=10)
    finally:
        if user.poll() is None:
            user.kill()
            user.wait()
    assert user.returncode == 0 and "Traceback" not in err, err
    got = json.loads(out)
    assert got["steps_done"] == got["rows"] >= 20 and got["default_handler"]   # train installed no handler
    assert procs.wait(server, timeout=10) == 0                # its only worker left (not lost): it ends


@pytest.mark.timeout(240)
def test_an_interrupted_ddp_run_keeps_each_ranks_rows(tmp_path):
    """The all-reduce baseline stops as the parameter server does: each rank keeps its rows."""
    out = tmp_path / "run"
    with open(tmp_path / "stderr", "w") as stderr:
        launcher = subprocess.Popen(psrv_argv("run", "--mode", "ddp", "--workers", "2", "--steps", "3000",
                                              "--compute-ms", "10", "--no-progress", "--out", str(out)),
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for rank in (0, 1):  # each rank's 20th row written: in lockstep, one rank may still be writing its row
            _wait_for_steps(out / f"worker-{rank}.progress", 20, launcher, tmp_path / "stderr")
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(30) == 130
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    err = (tmp_path / "stderr").read_text()
    assert "Traceback" not in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["steps_done"] == len(_rows(out / "steps.csv")) >= 40
    for rank in (0, 1):
        record = json.loads((out / f"worker-{rank}.json").read_text())
        assert record["interrupted"] is True and record["steps_done"] == len(record["step_log"]) >= 20
        assert "Traceback" not in (out / f"worker-{rank}.log").read_text()
    assert not (out / "params.pt").exists()  # partial weights are not a result
