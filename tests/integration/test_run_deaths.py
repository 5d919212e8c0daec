"""Deaths psrv run did not ask for (experiments/launcher/deaths.py), as real `psrv run` processes: a process kill -9ed from
outside (os.kill here, by PID, at a step read from the run's progress files) or a rank that crashes is in
summary.json with its name, exit code or signal and what it cost; an async run goes on without a dead worker, as
under --kill-worker; a run that fails keeps its steps.csv and a summary marked incomplete with the cause."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from psrv.step_beacon import read_beacon
from tests.conformance.job import NAN_STEP
from tests.helpers import ROOT, psrv_argv
from tests.integration.test_interrupts import _children

# these walk the launcher's process tree, its fork server in it: no zygote (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("own_fork_server")

SCRIPT = Path(__file__).with_name("script_loop.py")  # FAIL_AT: rank 1 raises before that step


class Run:
    """One `psrv run` in a session of its own, its output in DIR.out; `kill(name)` SIGKILLs one of its processes by
    PID (found among the launcher's children by its config file, DIR/config-NAME.json). Every PID it saw is killed
    at teardown, the launcher's first."""

    def __init__(self, out: Path, *args: str):
        self.out, self.seen = out, set()
        with open(out.with_suffix(".out"), "w") as log:
            self.proc = subprocess.Popen(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--out", str(out),
                                                   *args), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

    @property
    def said(self) -> str:
        return self.out.with_suffix(".out").read_text()

    def steps(self, name: str) -> int:
        try:
            return int((self.out / f"{name}.progress").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def wait_steps(self, name: str, steps: int, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while (done := self.steps(name)) < steps:
            assert self.proc.poll() is None, f"psrv run ended before {name}'s step {steps}:\n{self.said[-3000:]}"
            assert time.monotonic() < deadline, f"{name} did less than {steps} steps in {timeout}s"
            time.sleep(0.02)
        return done

    def pid(self, name: str) -> int:
        mark = f"config-{name}.json"
        for child in _children(self.proc.pid, forkserver=True):  # the fork server's children too
            try:
                words = Path(f"/proc/{child}/cmdline").read_bytes().decode().replace("\0", " ").split()
            except FileNotFoundError:
                continue
            self.seen.add(child)
            if any(w.endswith(mark) for w in words):  # a forked process's title is its command line in one piece
                return child
        raise AssertionError(f"no process {name} among psrv run's children")

    def kill(self, name: str) -> int:
        pid = self.pid(name)
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"psrv run still running after {timeout}s:\n{self.said[-3000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.seen:  # its processes, each in a session of its own (they also die with the launcher)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def runs(tmp_path):
    started = []

    def start(*args: str) -> Run:
        run = Run(tmp_path / f"run{len(started)}", *args)
        started.append(run)
        return run
    yield start
    for run in started:
        run.close()


def _summary(run: Run) -> dict:
    return json.loads((run.out / "summary.json").read_text())


def _rows(run: Run) -> list[dict]:
    with open(run.out / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


STEPS = 120
SMALL = ("--job", "digits_mlp", "--servers", "1", "--steps", str(STEPS), "--compute-ms", "20")


@pytest.mark.timeout(60)
def test_a_worker_killed_from_outside_in_async_is_survived_and_recorded(runs):
    run = runs("--mode", "async", "--workers", "3", "--worker-timeout", "2", *SMALL)
    run.wait_steps("worker-2", 20)
    pid = run.kill("worker-2")
    assert run.wait() == 0, run.said
    s = _summary(run)
    assert s["complete"] is True
    [death] = s["faults"]["deaths"]
    assert {k: death[k] for k in ("process", "rank", "exit_code", "signal", "cause", "survived")} == {
        "process": "worker-2", "rank": 2, "exit_code": -9, "signal": "SIGKILL", "cause": "was killed by signal 9",
        "survived": True}
    clock = death["last_clock"]  # exact, from its history: every push it sent shard 0 that was acknowledged
    assert (run.out / "history" / f"worker-2.{pid}.jsonl").exists()
    assert 19 <= clock < STEPS - 1 and death["steps_not_done"] == STEPS - 1 - clock
    assert 20 <= death["rank_steps"] <= clock + 1 and death["step"] >= 0 and death["wall_s"] > 0
    rows = _rows(run)
    for rank in (0, 1):  # the others did every step; the dead one wrote no record
        assert sorted(int(r["step"]) for r in rows if r["worker"] == str(rank)) == list(range(STEPS))
    assert not any(r["worker"] == "2" for r in rows) and not (run.out / "worker-2.json").exists()
    # async: each push applied once; the one it had sent when killed may have been applied, unacknowledged
    assert 2 * STEPS + clock + 1 <= s["updates_applied"] <= 2 * STEPS + clock + 2
    assert f"died                worker-2 was killed by signal 9 at worker 0's step {death['step']}" in run.said


@pytest.mark.timeout(60)
def test_a_backup_then_the_primary_killed_from_outside_are_recorded_as_under_kill_server(runs):
    """One run for both (each costs a run's start): backup-0-1 at worker 0's step 20, server-0 at step 60."""
    run = runs("--mode", "async", "--workers", "2", "--replicas", "2", *SMALL)
    for victim, step in (("backup-0-1", 20), ("server-0", 60)):
        run.wait_steps("worker-0", step)
        run.kill(victim)
    assert run.wait() == 0, run.said
    s = _summary(run)
    assert s["complete"] is True and s["faults"]["kills"] == [] and s["faults"]["deaths"] == []
    backup, primary = s["faults"]["dead_replicas"]  # the record --kill-server's kill of a replica makes
    for dead, victim in ((backup, "backup-0-1"), (primary, "server-0")):
        assert {k: dead[k] for k in ("process", "exit_code", "signal", "cause")} == {
            "process": victim, "exit_code": -9, "signal": "SIGKILL", "cause": "was killed by signal 9"}
        assert dead["replaced_by"].startswith("backup-0-")
        assert f"{victim} was killed by signal 9 at worker 0's step {dead['step']}, replaced by " \
               f"{dead['replaced_by']}" in run.said  # the `died` line
    assert 20 <= backup["step"] <= primary["step"] and primary["step"] >= 60
    assert len(s["replication"]["failovers"]) == 1  # the primary's death is a takeover, the backup's none
    assert s["updates_applied"] == 2 * STEPS  # nothing acknowledged was lost, nothing applied twice


@pytest.mark.timeout(60)
def test_a_crashed_rank_ends_the_run_which_keeps_its_steps_and_an_incomplete_summary(runs, tmp_path):
    run = runs("--mode", "sync", "--servers", "1", "--workers", "2", "--steps", "40", "--script", str(SCRIPT), "1",
               str(tmp_path / "final.pt"), "10")
    assert run.wait() == 1, run.said
    first = f"rank 1 ({SCRIPT}) exited with code 1 (RuntimeError: rank 1 fails at step 10, as asked); its output: " \
            f"{run.out / 'worker-1.log'}"
    rows = _rows(run)
    assert f"psrv run failed: {first}\nwrote the {len(rows)} steps that ran to {run.out} (summary.json marked " \
           "incomplete, steps.csv)\n" in run.said
    assert sorted(int(r["step"]) for r in rows if r["worker"] == "1") == list(range(10))  # the crashed rank's own
    assert {r["worker"] for r in rows} == {"0", "1"}  # rank 0's, up to where it was stopped
    s = _summary(run)
    assert (s["complete"], s["interrupted"], s["steps_done"], s["cause"]) == (False, False, len(rows), first)
    [death] = s["faults"]["deaths"]
    assert {k: death[k] for k in ("process", "rank", "exit_code", "signal", "cause", "survived", "last_clock",
                                  "steps_not_done")} == {
        "process": "worker-1", "rank": 1, "exit_code": 1, "signal": None, "cause": "exited with code 1",
        "survived": False, "last_clock": 9, "steps_not_done": 30}


@pytest.mark.timeout(60)
def test_a_shipped_worker_stopped_by_a_shards_refusal_keeps_its_steps_in_the_summary(runs):
    """The shipped loop's worker 1 pushes a NaN gradient at its step NAN_STEP (tests/conformance/job.py's tiny_nan);
    the shard refuses it (--nonfinite reject, the default) and the worker stops on the error. Its record says so
    (`failed`, the refusal's line) and keeps the steps it did, so summary.json's steps_done counts them: a run
    whose every worker fails this way once said 0 steps done (1-bit Adam's quality grid)."""
    run = runs("--mode", "sync", "--servers", "1", "--workers", "2", "--steps", "20", "--batch-size", "16",
               "--job", str(ROOT / "tests" / "conformance" / "job.py") + ":tiny_nan")
    assert run.wait() == 1, run.said
    record = json.loads((run.out / "worker-1.json").read_text())
    assert record["failed"].startswith("shard 0: NONFINITE") and record["steps_done"] == NAN_STEP, record
    assert not (run.out / "worker-1.pt").exists() and "interrupted" not in record
    rows = _rows(run)
    assert sorted(int(r["step"]) for r in rows if r["worker"] == "1") == list(range(NAN_STEP))
    s = _summary(run)
    assert (s["complete"], s["steps_done"]) == (False, len(rows)) and s["cause"].startswith("worker-1 exited"), s


def _rank_pid(run: Run, rank: int) -> int:
    """The all-reduce rank `rank`'s PID: the ranks share one command line, and a rank forked from the run's fork
    server shows the fork server's environment in /proc, so the PID is the one its step beacon names
    (experiments/launcher/stall.py), checked to be one of psrv run's processes."""
    beacon = read_beacon(run.out / f"worker-{rank}.beat")
    children = _children(run.proc.pid, forkserver=True)
    run.seen.update(children)
    if beacon is None or beacon.pid not in children:
        raise AssertionError(f"no rank {rank} among psrv run's children ({beacon}; {sorted(children)})")
    return beacon.pid


@pytest.mark.timeout(90)
def test_a_ddp_rank_whose_peer_was_killed_keeps_its_steps_in_the_summary(runs):
    """Rank 1 of a DDP run killed from outside: rank 0's next all-reduce fails, or the launcher's stop reaches it
    first, and either way its record keeps the steps it did (`failed` with the collective's error, or `interrupted`:
    which comes first is a race, and a loaded CI machine saw the stop win), so summary.json's steps_done counts them
    (it said 0)."""
    run = runs("--mode", "ddp", "--workers", "2", "--job", "digits_mlp", "--steps", str(STEPS), "--compute-ms", "20")
    run.wait_steps("worker-1", 20)
    os.kill(_rank_pid(run, 1), signal.SIGKILL)
    assert run.wait() == 1, run.said
    record = json.loads((run.out / "worker-0.json").read_text())
    assert (record.get("failed") or record.get("interrupted")) and record["steps_done"] >= 20, record
    rows = _rows(run)
    assert {r["worker"] for r in rows} == {"0"} and len(rows) == record["steps_done"]
    s = _summary(run)
    assert (s["complete"], s["steps_done"]) == (False, len(rows)), s


@pytest.mark.timeout(60)
def test_in_plain_sync_a_worker_killed_from_outside_ends_the_run_which_keeps_what_ran(runs):
    """Plain sync is not survived (every rank's gradient in every clock is the run asked for): the death ends it,
    recorded, and the others leave and write their rows."""
    run = runs("--mode", "sync", "--workers", "2", *SMALL)
    run.wait_steps("worker-1", 20)
    run.kill("worker-1")
    assert run.wait() == 1, run.said
    s = _summary(run)
    cause = f"worker-1 was killed by signal 9; its output: {run.out / 'worker-1.log'}"
    assert (s["complete"], s["cause"]) == (False, cause) and f"psrv run failed: {cause}\n" in run.said
    [death] = s["faults"]["deaths"]
    assert (death["process"], death["signal"], death["survived"]) == ("worker-1", "SIGKILL", False)
    rows = _rows(run)
    assert s["steps_done"] == len(rows) >= 20 and {r["worker"] for r in rows} == {"0"}
