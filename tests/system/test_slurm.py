"""psrv's SLURM scheduler on a real one-node SLURM (tests/system/slurm_node.py).

`psrv experiment experiments/specs/tiny.toml --scheduler slurm` runs every server and worker as a job
step, and its report and summaries equal a local run's in their counts and settings; SLURM's own records
(squeue's step list while it runs, the job completion log after) show where the processes ran. The local
run and the SLURM run go at once: each is mostly processes importing torch, so together they take little
longer than one. Then the rest of the scheduler's contract: the DDP baseline's weights, a failed rank in
one line, Ctrl-C reaching each worker, a launcher killed outright, and a run inside an sbatch job; after
each, no job or step is left. Needs root and the SLURM packages; skipped otherwise.
"""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.system.slurm_node import slurm_node  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

SPEC = ROOT / "experiments" / "specs" / "tiny.toml"
VARIANTS = ("sync", "async")
SAME = ("complete", "mode", "staleness", "transport", "job", "num_servers", "num_workers", "steps", "batch_size",
        "optimizer", "lr", "seed", "device", "pushes", "bytes_pushed", "bytes_pulled", "config_hash", "metric",
        "lower_is_better", "parameters")


def _experiment(out: Path, env: dict, *extra: str) -> subprocess.Popen:
    log = open(out.with_suffix(".log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "psrv.cli", "experiment", str(SPEC), "--out", str(out), *extra],
                            cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return proc


class _StepWatch(threading.Thread):
    """squeue's list of job steps, polled while the SLURM run goes: (step id, step name, node) lines."""

    def __init__(self, env: dict):
        super().__init__(daemon=True)
        self.env, self.seen, self.done = env, set(), threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            out = subprocess.run(["squeue", "--steps", "--noheader", "--format", "%i %j %N"], env=self.env,
                                 capture_output=True, text=True, timeout=10).stdout
            self.seen.update(tuple(line.split()) for line in out.splitlines() if line.strip())
            time.sleep(0.3)


def _table(report: Path) -> list[list[str]]:
    """The report's summary table, its settings columns only (variant, mode, s, repeats, updates)."""
    section = report.read_text().split("## Summary")[1].split("\n## ")[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    return [[c.strip() for i, c in enumerate(row) if i in (0, 1, 2, 3, 9)] for row in rows]


def _settings(report: Path) -> list[str]:
    """The report's lines that state settings: its header (before the result) and the commands, paths cut."""
    text = report.read_text()
    head = text.split("## Result")[0]
    commands = re.sub(r"--out \S+|--config \S+", "", text.split("## Commands")[1])
    return head.splitlines() + commands.splitlines()


def test_experiment_under_slurm_equals_local(slurm_node, tmp_path):
    # stays slow: every process is a real SLURM job step (the point), and the same spec runs locally beside it
    env = dict(slurm_node.env)
    watch = _StepWatch(env)
    started = time.monotonic()
    procs = []
    try:
        procs.append(_experiment(tmp_path / "local", env))
        procs.append(_experiment(tmp_path / "slurm", env, "--scheduler", "slurm"))
        watch.start()
        for proc in procs:
            proc.wait(timeout=240)
    finally:
        watch.done.set()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    took = time.monotonic() - started
    for name, proc in zip(("local", "slurm"), procs):
        assert proc.returncode == 0, f"{name} experiment failed:\n{(tmp_path / f'{name}.log').read_text()[-3000:]}"

    for variant in VARIANTS:
        local = json.loads((tmp_path / "local" / variant / "rep-0" / "summary.json").read_text())
        slurm = json.loads((tmp_path / "slurm" / variant / "rep-0" / "summary.json").read_text())
        assert (local["scheduler"], slurm["scheduler"]) == ("local", "slurm")
        assert {k: slurm[k] for k in SAME} == {k: local[k] for k in SAME}, variant
        assert slurm["pushes"] == 2 * 40 and set(slurm) == set(local)
        for where in ("local", "slurm"):  # samples: every worker step's batch, in steps.csv
            rows = list(csv.DictReader((tmp_path / where / variant / "rep-0" / "steps.csv").open()))
            assert (len(rows), sum(int(r["batch_size"]) for r in rows)) == (2 * 40, 2 * 40 * 32), where
    # sync is one deterministic trajectory, wherever its processes ran
    sync = [json.loads((tmp_path / d / "sync" / "rep-0" / "summary.json").read_text()) for d in ("local", "slurm")]
    assert sync[0]["updates_applied"] == sync[1]["updates_applied"] == 40
    assert sync[1]["final_loss"] == pytest.approx(sync[0]["final_loss"], abs=1e-6)

    reports = [tmp_path / d / "report.md" for d in ("local", "slurm")]
    assert _table(reports[1]) == _table(reports[0]) and len(_table(reports[0])) == 2
    assert _settings(reports[1]) == _settings(reports[0])
    runs = [list(csv.DictReader((tmp_path / d / "runs.csv").open())) for d in ("local", "slurm")]
    assert [r["config_hash"] for r in runs[1]] == [r["config_hash"] for r in runs[0]]

    # SLURM ran them: one job per run, a step per process, and nothing left behind
    jobs = [line for line in slurm_node.jobcomp.read_text().splitlines() if "Name=psrv-" in line]
    names = sorted(re.search(r"Name=(\S+)", line).group(1) for line in jobs)
    assert names == ["psrv-async-rep-0", "psrv-sync-rep-0"], jobs
    job_ids = sorted(re.search(r"JobId=(\d+)", line).group(1) for line in jobs)
    steps = {step.split(".")[0]: set() for step, _, _ in watch.seen}
    for step, name, _ in watch.seen:
        steps[step.split(".")[0]].add(name)
    assert sorted(steps) == job_ids and all(s == {"server-0", "worker-0", "worker-1"} for s in steps.values()), \
        watch.seen
    assert slurm_node.run("squeue", "--noheader").strip() == ""
    print(f"\nboth experiments took {took:.1f}s; squeue saw:\n" +
          "\n".join(" ".join(s) for s in sorted(watch.seen)) + "\njobcomp:\n" + "\n".join(jobs))


SCRIPT = ROOT / "tests" / "integration" / "script_loop.py"  # a psrv.Worker loop; rank 1 fails at FAIL_AT


def _psrv_run(slurm_node, tmp: Path, *args: str) -> subprocess.Popen:
    with open(tmp / "launcher.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "psrv.cli", "run", "--no-progress", "--log-level", "WARNING",
                                 "--scheduler", "slurm", "--out", str(tmp / "run"), *args], cwd=ROOT,
                                env={**slurm_node.env, "PYTHONUNBUFFERED": "1"}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def _no_job_left(slurm_node) -> None:
    """Nothing of the run is left in SLURM: no job, no step (the run's allocation was released)."""
    deadline = time.monotonic() + 10
    while slurm_node.run("squeue", "--noheader").strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_node.run("squeue", "--noheader").strip() == ""
    assert slurm_node.run("squeue", "--steps", "--noheader").strip() == ""


def test_a_failed_script_rank_under_slurm_fails_the_run_in_one_line_and_leaves_no_job(slurm_node, tmp_path):
    # a script's ranks find the servers through the addresses they publish in the run folder
    proc = _psrv_run(slurm_node, tmp_path, "--mode", "sync", "--servers", "1", "--script", str(SCRIPT), "1",
                     str(tmp_path / "final.pt"), "3")
    assert _finish(proc, 120) == 1, (tmp_path / "launcher.log").read_text()
    out = tmp_path / "run"
    lines = [line for line in (tmp_path / "launcher.log").read_text().splitlines() if "psrv run" in line]
    assert lines == [f"psrv run failed: rank 1 ({SCRIPT}) exited with code 1 (RuntimeError: rank 1 fails at "
                     f"step 3, as asked); its output: {out / 'worker-1.log'}"], lines
    assert "Traceback" in (out / "worker-1.log").read_text()
    _no_job_left(slurm_node)


def test_ctrl_c_under_slurm_reaches_each_worker_and_leaves_no_job(slurm_node, tmp_path):
    proc = _psrv_run(slurm_node, tmp_path, "--mode", "sync", "--servers", "1", "--workers", "2", "--steps", "3000",
                     "--compute-ms", "10")
    out = tmp_path / "run"
    try:
        deadline = time.monotonic() + 90
        while not (out / "worker-0.progress").exists() or int((out / "worker-0.progress").read_text() or 0) < 20:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()
            time.sleep(0.1)
        proc.send_signal(2)
        assert _finish(proc, 60) == 130, (tmp_path / "launcher.log").read_text()
    finally:
        _finish(proc, 0.1) if proc.poll() is None else None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["steps_done"] >= 40 and summary["scheduler"] == "slurm"
    for rank in (0, 1):  # SIGINT reached each worker's task through scancel: it left and wrote its record
        record = json.loads((out / f"worker-{rank}.json").read_text())
        assert record["interrupted"] is True and "Traceback" not in (out / f"worker-{rank}.log").read_text()
    _no_job_left(slurm_node)


def test_ddp_under_slurm_ends_with_the_weights_of_ddp_run_here(slurm_node, tmp_path):
    """The all-reduce ranks as job steps, their rendezvous at the first rank's node: the same weights."""
    import torch
    args = ("--mode", "ddp", "--workers", "2", "--steps", "15")
    local = subprocess.run([sys.executable, "-m", "psrv.cli", "run", "--no-progress", "--log-level", "WARNING",
                            "--out", str(tmp_path / "local"), *args], cwd=ROOT, env=slurm_node.env,
                           capture_output=True, text=True, timeout=120)
    assert local.returncode == 0, local.stdout + local.stderr
    assert _finish(_psrv_run(slurm_node, tmp_path, *args), 120) == 0, (tmp_path / "launcher.log").read_text()
    here, there = (torch.load(tmp_path / d / "params.pt") for d in ("local", "run"))
    assert torch.allclose(here, there, atol=1e-6, rtol=0)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["scheduler"] == "slurm"
    _no_job_left(slurm_node)


def test_a_launcher_killed_outright_leaves_no_job_behind(slurm_node, tmp_path):
    """kill -9 of psrv run: its srun steps get SIGTERM as it dies (and end their tasks), and the salloc
    holding its allocation sees its stdin close and releases it."""
    proc = _psrv_run(slurm_node, tmp_path, "--mode", "async", "--servers", "1", "--workers", "2", "--steps", "3000",
                     "--compute-ms", "10")
    progress = tmp_path / "run" / "worker-0.progress"
    try:
        deadline = time.monotonic() + 90
        while not progress.exists() or int(progress.read_text() or 0) < 5:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()
            time.sleep(0.1)
        assert slurm_node.run("squeue", "--steps", "--noheader").count("\n") == 3  # server-0, worker-0, worker-1
        proc.kill()
        proc.wait()
    finally:
        _finish(proc, 0.1) if proc.poll() is None else None
    _no_job_left(slurm_node)
    assert "JobState=COMPLETED" in slurm_node.jobcomp.read_text().splitlines()[-1]


def test_inside_an_sbatch_job_the_run_takes_that_jobs_allocation(slurm_node, tmp_path):
    """psrv run in a batch script (the way onto many nodes): its processes are steps of that job, no other."""
    jobs_before = len(slurm_node.jobcomp.read_text().splitlines()) if slurm_node.jobcomp.exists() else 0
    out = tmp_path / "run"
    command = (f"{sys.executable} -m psrv.cli run --scheduler slurm --no-progress --mode sync --servers 1 "
               f"--workers 2 --steps 10 --out {out}")
    done = subprocess.run(["sbatch", "--wait", "--parsable", "--ntasks=3", "--overcommit", "--job-name=psrv-batch",
                           f"--output={tmp_path / 'batch.log'}", f"--chdir={ROOT}", "--wrap", command],
                          env=slurm_node.env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr + (tmp_path / "batch.log").read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["scheduler"] == "slurm" and summary["pushes"] == 20
    jobs = slurm_node.jobcomp.read_text().splitlines()[jobs_before:]
    assert len(jobs) == 1 and "Name=psrv-batch JobState=COMPLETED" in jobs[0], jobs
    _no_job_left(slurm_node)
