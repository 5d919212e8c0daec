"""`psrv experiment`: every variant runs, the tables, plots and report appear, and a rerun resumes."""
from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from tests.helpers import psrv_argv, run_in_session

SPEC = """
name = "tiny"
seeds = [0]

[job]
name = "{job}"
steps = 20
batch_size = 32
eval_every = 10

[optimizer]
name = "sgd"
lr = 0.05

[cluster]
servers = 1
workers = 2

[target]
eval_accuracy = 0.2
"""
PLOTS = ("eval_loss_vs_time", "eval_loss_vs_step", "eval_accuracy_vs_time", "throughput", "staleness",
         "time_breakdown")


def write_spec(tmp_path: Path, modes: tuple[str, ...], *, job: str = "digits_mlp") -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(SPEC.format(job=job) + "".join(f'\n[[variants]]\nmode = "{m}"\n' for m in modes))
    return path


def experiment(spec: Path, out: Path, *, timeout: float):
    return run_in_session(psrv_argv("experiment", str(spec), "--out", str(out)), timeout=timeout)


@pytest.mark.timeout(330)
def test_experiment_runs_every_variant_then_resumes(tmp_path):
    spec, out = write_spec(tmp_path, ("sync", "async")), tmp_path / "out"
    first = experiment(spec, out, timeout=240)
    assert first.returncode == 0, first.stdout[-4000:]
    assert f"report: {out / 'report.md'}" in first.stdout
    with open(out / "summary.csv", newline="") as f:
        rows = {row["variant"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"sync", "async"}
    assert rows["sync"]["updates_applied"] == "20" and rows["sync"]["repeats"] == "1"
    for variant in rows:
        for name in ("steps.csv", "evals.csv"):
            assert len((out / variant / name).read_text().splitlines()) > 1, f"{variant}/{name} is empty"
    for plot in PLOTS:
        assert (out / "plots" / f"{plot}.png").stat().st_size > 1000, plot
    report = (out / "report.md").read_text()
    assert "sync" in report and "async" in report and "plots/throughput.png" in report

    reps = {p: p.stat().st_mtime_ns for v in rows for p in [out / v / "rep-0", out / v / "rep-0" / "summary.json"]}
    t0 = time.monotonic()
    second = experiment(spec, out, timeout=120)
    assert second.returncode == 0, second.stdout[-4000:]
    assert "skipped sync rep-0" in second.stdout and "skipped async rep-0" in second.stdout
    assert not [line for line in second.stdout.splitlines() if line.startswith("finished ")]
    assert {p: p.stat().st_mtime_ns for p in reps} == reps, "a finished run was run again"
    assert time.monotonic() - t0 < 90


@pytest.mark.timeout(180)
def test_a_failed_run_is_recorded_and_the_experiment_goes_on(tmp_path):
    broken = tmp_path / "broken_job.py"  # imports, so the spec is valid; the workers fail building it
    broken.write_text("def build(seed):\n    raise RuntimeError('this job is broken on purpose')\n")
    spec, out = write_spec(tmp_path, ("async",), job=f"{broken}:build"), tmp_path / "out"
    proc = experiment(spec, out, timeout=150)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "FAILED async rep-0" in proc.stdout
    assert "broken on purpose" in (out / "async" / "rep-0" / "error.txt").read_text()
    assert (out / "report.md").exists()
