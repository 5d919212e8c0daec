"""TensorBoard events written from a run's records read back (tensorboard's EventAccumulator) as exactly
the values of its steps.csv and evals.csv (at TensorBoard's float32), and the servers' staleness
histograms as histograms."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from psrv.experiments.harness.collect import number, read_csv
from psrv.experiments.harness.tracking import STEP_SCALARS, write_events

STEPS = ["wall_time", "worker", "step", "loss", "staleness", "compute_seconds", "communication_seconds",
         "wait_seconds", "batch_size"]


def _run(path: Path, *, staleness: bool = True) -> Path:
    path.mkdir(parents=True)
    rng = np.random.default_rng(3)
    with open(path / "steps.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(STEPS)
        for s in range(5):
            for worker in (0, 1):
                w.writerow([0.01 * (2 * s + worker), worker, s, 2.3 / (s + 1) + rng.random() / 7,
                            (s + worker) % 3 if staleness else "", *rng.random(3) / 100, 32])
    with open(path / "evals.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["wall_time", "step", "eval_loss", "eval_accuracy", "eval_perplexity"])
        w.writerow([0.0, 0, 2.31, 0.08, 10.07])
        w.writerow([0.1, 5, 0.4123456789, 0.9012345, 1.51])
    if staleness:
        (path / "server-0.json").write_text(json.dumps(
            {"shard": 0, "version": 10, "staleness_histogram": {"0": 4, "1": 3, "2": 3}}))
    return path


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_the_scalars_are_the_csvs_values(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    logdir = write_events(run, tmp_path / "tb" / "sync" / "seed-0")
    got = _scalars(logdir)
    want: dict[str, list[tuple[int, float]]] = {}
    for row in read_csv(run / "steps.csv"):
        for column in STEP_SCALARS:
            want.setdefault(f"worker-{row['worker']}/{column}", []).append(
                (int(row["step"]), float(np.float32(number(row[column])))))
    for row in read_csv(run / "evals.csv"):
        for name in ("loss", "accuracy", "perplexity"):
            want.setdefault(f"eval/{name}", []).append((int(row["step"]), float(np.float32(number(row[f"eval_{name}"])))))
    assert got == want
    assert len(got) == 2 * len(STEP_SCALARS) + 3


def test_staleness_histogram_and_a_rewrite_does_not_double_the_points(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    logdir = tmp_path / "tb"
    write_events(run, logdir)
    write_events(run, logdir)  # the experiment writes a finished run's events again on a rerun
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("worker-0/loss")] == [0, 1, 2, 3, 4]
    [hist] = acc.Histograms("server-0/staleness")
    assert hist.step == 10
    h = hist.histogram_value
    assert (h.min, h.max, h.num, h.sum, h.sum_squares) == (0, 2, 10, 9, 15)
    assert list(h.bucket) == [4, 3, 3] and list(h.bucket_limit) == [0.5, 1.5, 2.5]


def test_an_allreduce_run_has_no_staleness_to_write(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", staleness=False)
    got = _scalars(write_events(run, tmp_path / "tb"))
    assert "worker-0/staleness" not in got and "worker-0/loss" in got
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert acc.Tags()["histograms"] == []


def test_writing_the_events_imports_no_torch(tmp_path: Path) -> None:
    """The harness and the launcher write a run's events without torch (about 2 s of CPU to import)."""
    import subprocess
    import sys
    run = _run(tmp_path / "run")
    code = ("import sys; from psrv.experiments.harness.tracking import write_events; "
            f"write_events({str(run)!r}, {str(tmp_path / 'tb')!r}); sys.exit('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr or "writing the events imported torch"
    assert _scalars(tmp_path / "tb") == _scalars(write_events(run, tmp_path / "again"))
