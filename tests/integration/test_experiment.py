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
workers = {workers}

[target]
eval_accuracy = 0.2
"""
PLOTS = ("loss_curves", "accuracy_curves", "worker_timeline", "throughput", "time_breakdown", "staleness",
         "staleness_over_time")


def write_spec(tmp_path: Path, modes: tuple[str, ...], *, job: str = "digits_mlp", workers: int = 2,
               more: str = "") -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(SPEC.format(job=job, workers=workers) + "".join(f'\n[[variants]]\nmode = "{m}"\n' for m in modes)
                    + more)
    return path


def experiment(spec: Path, out: Path, *, timeout: float, extra: tuple[str, ...] = ()):
    return run_in_session(psrv_argv("experiment", str(spec), "--out", str(out), *extra), timeout=timeout)


def assert_events_are_the_steps(logdir: Path, steps_csv: Path) -> None:
    """The run's TensorBoard scalars, read back, are its steps.csv (at TensorBoard's float32)."""
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    with open(steps_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    for column in ("loss", "staleness", "compute_seconds", "communication_seconds", "wait_seconds"):
        for worker in ("0", "1"):
            want = [(int(r["step"]), float(np.float32(r[column]))) for r in rows if r["worker"] == worker]
            got = [(e.step, e.value) for e in acc.Scalars(f"worker-{worker}/{column}")]
            assert got == want and len(got) == 20, (column, worker)


def assert_mlflow_has_the_runs(uri: str, out: Path, variants) -> dict[str, str]:
    """MLflow's client reads back one run per variant (its params, a loss history as long as its steps, its
    evals, its files) and the report; returns each MLflow run's id by name."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    found = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    runs = {r.info.run_name: r for r in found}
    assert len(runs) == len(found) and set(runs) == {f"{v}/seed-0" for v in variants} | {"report"}
    for variant in variants:
        run, folder = runs[f"{variant}/seed-0"], out / variant / "rep-0"
        assert (run.data.params["mode"], run.data.params["optimizer.lr"]) == (variant.split("-")[0], "0.05")
        with open(folder / "steps.csv", newline="") as f:
            steps = [int(r["step"]) for r in csv.DictReader(f) if r["worker"] == "1"]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "worker-1/loss")] == steps == list(range(20))
        with open(folder / "evals.csv", newline="") as f:
            evals = [float(r["eval_accuracy"]) for r in csv.DictReader(f)]
        assert [m.value for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == evals
        assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.json", "summary.json"}
    assert "report.md" in {a.path for a in client.list_artifacts(runs["report"].info.run_id)}
    return {name: run.info.run_id for name, run in runs.items()}


@pytest.mark.timeout(330)
def test_experiment_runs_every_variant_then_resumes(tmp_path):
    # stays slow (two harness runs, 2 variants x 2 workers): every variant, both workers and the resume are its point
    straggler = '\n[[variants]]\nname = "async-straggler"\nmode = "async"\nfaults = { straggler = "1:4" }\n'
    spec, out, tb = write_spec(tmp_path, ("sync", "async"), more=straggler), tmp_path / "out", tmp_path / "tb"
    mlflow = f"sqlite:///{tmp_path}/mlflow.db"
    first = experiment(spec, out, timeout=240, extra=("--tensorboard", str(tb), "--mlflow", mlflow))
    assert first.returncode == 0, first.stdout[-4000:]
    assert f"report: {out / 'report.md'}" in first.stdout
    with open(out / "summary.csv", newline="") as f:
        rows = {row["variant"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"sync", "async", "async-straggler"}
    assert rows["sync"]["updates_applied"] == "20" and rows["sync"]["repeats"] == "1"
    # goodput: the straggler's useful samples/s over its fault-free variant's (the same seed), and for no other
    with open(out / "runs.csv", newline="") as f:
        runs = {row["variant"]: row for row in csv.DictReader(f)}
    useful = {v: float(runs[v]["useful_samples_per_second"]) for v in runs}
    assert all(rate > 0 for rate in useful.values()), useful
    assert float(rows["async-straggler"]["goodput"]) == pytest.approx(useful["async-straggler"] / useful["async"])
    assert rows["async"]["goodput"] == rows["sync"]["goodput"] == ""
    for variant in rows:
        for name in ("steps.csv", "evals.csv"):
            assert len((out / variant / name).read_text().splitlines()) > 1, f"{variant}/{name} is empty"
    for plot in PLOTS:
        assert (out / "plots" / f"{plot}.png").stat().st_size > 1000, plot
    report = (out / "report.md").read_text()
    assert "sync" in report and "async" in report and "plots/throughput.png" in report
    assert "| `async-straggler` | `async` |" in report.split("## Goodput")[1], report
    for variant in rows:  # one TensorBoard run per variant and seed, the scalars of its steps.csv
        assert_events_are_the_steps(tb / "tiny" / variant / "seed-0", out / variant / "rep-0" / "steps.csv")
    assert f"MLflow {mlflow}, experiment 'tiny': runs 3 logged; report logged" in first.stdout
    logged = assert_mlflow_has_the_runs(mlflow, out, rows)

    reps = {p: p.stat().st_mtime_ns for v in rows for p in [out / v / "rep-0", out / v / "rep-0" / "summary.json"]}
    spec.write_text(f'mlflow = "{mlflow}"\n' + spec.read_text())  # the spec's key now: no rerun, no second MLflow run
    t0 = time.monotonic()
    second = experiment(spec, out, timeout=120, extra=("--tensorboard", str(tmp_path / "tb2")))
    assert second.returncode == 0, second.stdout[-4000:]
    assert f"MLflow {mlflow}, experiment 'tiny': runs 3 already there" in second.stdout
    assert assert_mlflow_has_the_runs(mlflow, out, rows) == logged
    assert all(f"skipped {v} rep-0" in second.stdout for v in rows)
    assert not [line for line in second.stdout.splitlines() if line.startswith("finished ")]
    assert {p: p.stat().st_mtime_ns for p in reps} == reps, "a finished run was run again"
    assert time.monotonic() - t0 < 90
    # another TensorBoard folder is no reason to train again: the finished runs' events are written there
    assert_events_are_the_steps(tmp_path / "tb2" / "tiny" / "async" / "seed-0", out / "async" / "rep-0" / "steps.csv")


@pytest.mark.timeout(180)
def test_a_failed_run_is_recorded_and_the_experiment_goes_on(tmp_path):
    broken = tmp_path / "broken_job.py"  # imports, so the spec is valid; the workers fail building it
    broken.write_text("def build(seed):\n    raise RuntimeError('this job is broken on purpose')\n")
    # one worker: what is tested is the harness going on past a failed run, not how many workers fail
    spec, out = write_spec(tmp_path, ("async",), job=f"{broken}:build", workers=1), tmp_path / "out"
    proc = experiment(spec, out, timeout=150)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "FAILED async rep-0" in proc.stdout
    assert "broken on purpose" in (out / "async" / "rep-0" / "error.txt").read_text()
    assert (out / "report.md").exists()
