"""A run folder is owned by one run: a second `psrv run` (or `psrv experiment`) into a folder in use is
refused in one line (exit 2); the lock dies with the run (kill -9 included: the kernel releases it and
the run's processes stop with their launcher); a reused folder keeps nothing of the run before."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, psrv_argv, run_in_session
from tests.integration.test_interrupts import _alive, _children, _progress

# these walk the launcher's process tree, its fork server in it: no zygote (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("own_fork_server")

SCRIPT = Path(__file__).with_name("script_loop.py")
RUN_LOCK, EXPERIMENT_LOCK = ".psrv-run.lock", ".psrv-experiment.lock"  # experiments/launcher/rundir.py's


def _launch(tmp_path: Path, name: str, *args: str) -> subprocess.Popen:
    """`psrv run ARGS` in a session of its own, its stdout and stderr to tmp_path/name.out and .err."""
    with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
        return subprocess.Popen(psrv_argv("run", "--no-progress", *args), cwd=ROOT, stdout=out, stderr=err,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for(condition, what: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, f"exited ({proc.returncode}) before {what}:\n" + \
            (log.read_text()[-3000:] if log else "")
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen, children: dict[int, str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid, started in children.items():
        if _alive(pid, started):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_a_second_run_into_a_folder_in_use_is_refused_and_the_first_keeps_its_own_summary(tmp_path):
    out, steps = tmp_path / "same", 150
    # one shard: what is tested is the folder's lock, not sharding (each process imports torch, ~1.8 s CPU)
    first = _launch(tmp_path, "sync", "--mode", "sync", "--workers", "2", "--servers", "1", "--steps", str(steps),
                    "--compute-ms", "10", "--out", str(out))
    children: dict[int, str] = {}
    try:
        _wait_for(lambda: _progress(out / "worker-0.progress") >= 10, "10 steps of the first run", 120, first,
                  tmp_path / "sync.err")
        children = _children(first.pid)
        second = run_in_session(psrv_argv("run", "--no-progress", "--mode", "async", "--workers", "2", "--steps",
                                          str(steps), "--out", str(out)), timeout=60)
        lines = second.stdout.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stdout
        assert lines[0].startswith(f"psrv run: error: {out} is in use by another run (psrv run, pid {first.pid}"), lines
        assert first.wait(120) == 0, (tmp_path / "sync.err").read_text()[-3000:]
    finally:
        _stop(first, children)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["mode"], summary["num_workers"], summary["pushes"]) == ("sync", 2, 2 * steps), summary
    assert summary["updates_applied"] == steps and summary["max_staleness"] == 0, summary   # sync: one per clock
    assert json.loads((out / "config.json").read_text())["mode"] == "sync"


@pytest.mark.timeout(240)
def test_the_lock_dies_with_a_killed_run_and_its_processes_stop(tmp_path):
    out = tmp_path / "run"
    # one shard: every process of the run stops, whatever their number (test_interrupts stops 2 shards)
    first = _launch(tmp_path, "killed", "--mode", "sync", "--workers", "2", "--servers", "1", "--steps", "5000",
                    "--compute-ms", "10", "--out", str(out))
    children: dict[int, str] = {}
    try:
        _wait_for(lambda: _progress(out / "worker-0.progress") >= 10, "10 steps", 120, first, tmp_path / "killed.err")
        children = _children(first.pid)
        assert len(children) == 3, children                          # 1 server, 2 workers
        children = _children(first.pid, forkserver=True)             # all must stop: the fork server too
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        # its processes stop with it (they would go on writing into the folder), and the lock goes with them
        _wait_for(lambda: not any(_alive(pid, started) for pid, started in children.items()),
                  "end of the killed run's processes", 30)
        # one worker: what is tested is that the folder is free again and a run there completes
        again = run_in_session(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--mode", "async",
                                         "--workers", "1", "--servers", "1", "--steps", "20", "--out", str(out)),
                               timeout=120)
        assert again.returncode == 0, again.stdout[-3000:]
    finally:
        _stop(first, children)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["mode"], summary["pushes"], summary["complete"]) == ("async", 20, True), summary


@pytest.mark.timeout(240)
def test_a_reused_folder_keeps_nothing_of_the_run_before_and_says_so(tmp_path):
    out, mlflow = tmp_path / "run", f"sqlite:///{tmp_path}/mlflow.db"
    # one shard and one worker each: what is tested is what a run leaves in the folder, not the cluster
    first = run_in_session(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--mode", "sync",
                                     "--workers", "1", "--servers", "1", "--steps", "10", "--out", str(out),
                                     "--mlflow", mlflow), timeout=120)
    assert first.returncode == 0 and (out / "model.pt").exists(), first.stdout[-3000:]
    before = {p.name for p in out.iterdir()}
    second = run_in_session(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--mode", "sync",
                                      "--workers", "1", "--servers", "1", "--steps", "5", "--out", str(out),
                                      "--mlflow", mlflow, "--script", str(SCRIPT), "1", str(tmp_path / "final.pt")),
                            timeout=120)
    assert second.returncode == 0, second.stdout[-3000:]
    said = [line for line in second.stdout.splitlines() if line.startswith(f"{out}: ")]
    assert len(said) == 1 and "removed" in said[0] and "model.pt" in said[0], second.stdout
    left = {p.name for p in out.iterdir()}
    assert "model.pt" not in left, sorted(left)       # the earlier run's (a script's rank 0 writes params.pt only)
    assert json.loads((out / "summary.json").read_text())["job"] == str(SCRIPT)
    assert before - left, (before, left)
    # `psrv run --mlflow`: the earlier run's MLflow run is its record now, kept beside the new one
    assert all(f"MLflow {mlflow}, experiment 'psrv run': runs 1 logged" in p.stdout for p in (first, second))
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=mlflow)
    runs = client.search_runs([client.get_experiment_by_name("psrv run").experiment_id],
                              order_by=["attributes.start_time"])
    assert [(r.info.run_name, r.data.params["job.steps"]) for r in runs] == \
        [("sync/seed-0", "10"), ("sync/seed-0", "5")]


HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    path = sys.argv[1]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\\t{sys.argv[2]}\\t2026-01-01 00:00:00\\n".encode())  # as experiments/launcher/rundir.py writes it
    print("held", flush=True)
    time.sleep(120)
""")


@pytest.mark.timeout(120)
def test_an_experiment_never_reuses_or_reruns_a_run_in_progress(tmp_path):
    """A run folder of the experiment held by another process (a run in progress there): the experiment
    is refused in one line before it runs anything; nothing of that folder is touched."""
    spec = tmp_path / "tiny.toml"
    spec.write_text('name = "tiny"\n[job]\nsteps = 5\n[target]\neval_loss = 9.0\n[[variants]]\nmode = "sync"\n')
    held = tmp_path / "out" / "sync" / "rep-0"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(held / RUN_LOCK), "psrv run"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (held / "summary.json").write_text(json.dumps({"mode": "sync"}))   # as if it had just finished
        proc = run_in_session(psrv_argv("experiment", str(spec), "--out", str(tmp_path / "out")), timeout=60)
    finally:
        holder.kill()
        holder.wait()
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout
    assert f"{held} is in use by another run (psrv run, pid {holder.pid}" in lines[0], lines
    assert sorted(p.name for p in held.iterdir()) == sorted([RUN_LOCK, "summary.json"])


@pytest.mark.timeout(120)
def test_a_second_experiment_into_a_folder_in_use_is_refused_in_one_line(tmp_path):
    spec = tmp_path / "tiny.toml"
    spec.write_text('name = "tiny"\n[job]\nsteps = 5\n[target]\neval_loss = 9.0\n[[variants]]\nmode = "sync"\n')
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out / EXPERIMENT_LOCK), "psrv experiment"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = run_in_session(psrv_argv("experiment", str(spec), "--out", str(out)), timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2 and proc.stdout.strip() == (
        f"psrv experiment: error: {out} is in use by another experiment (psrv experiment, pid {holder.pid}, "
        "started 2026-01-01 00:00:00); wait for it to end, or pass another --out"), proc.stdout
    assert [p.name for p in out.iterdir()] == [EXPERIMENT_LOCK]      # nothing else was written


def test_the_prometheus_files_beside_a_run_are_neither_refused_nor_cleared(tmp_path):
    """docs/deploy.md has Prometheus's config (and its database) sit in the run folder, where targets.json
    is: a run into such a folder, and into it again, leaves them be."""
    from psrv.experiments.launcher.rundir import OwnedFolder
    run = tmp_path / "watch"
    run.mkdir()
    for name in ("prometheus.yml", "rules.yml"):
        (run / name).write_text("kept\n")
    (run / "tsdb").mkdir()
    (run / "tsdb" / "chunk").write_text("kept\n")
    for attempt in range(2):
        with OwnedFolder(run, what="psrv run") as owned:
            removed = owned.clear()
            (run / "summary.json").write_text("{}")
        assert removed == ([] if attempt == 0 else ["summary.json"]), removed
    assert (run / "prometheus.yml").read_text() == "kept\n" and (run / "tsdb" / "chunk").exists()
