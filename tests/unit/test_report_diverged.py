"""A diverged repeat (its held-out loss NaN or Inf, docs/experiments.md "Diverged repeats") in collect and the
report: counted and named, never dropped from a mean, and never counted as reaching the target, even where an
evaluation met it before the loss went NaN. Fabricated run directories, as tests/unit/test_report.py's."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from psrv.experiments.harness.collect import collect, read_csv, read_summary, run_dir
from psrv.experiments.launcher.launch import write_config
from psrv.experiments.harness.report import write_report
from psrv.experiments.harness.spec import spec_from_dict

NAN = math.nan


def _run(out: Path, variant: str, repeat: int, final_loss: float, evals: list[tuple]) -> None:
    """evals: (wall_time, step, eval_loss, eval_accuracy), written as psrv run writes them (NaN as 'nan')."""
    path = run_dir(out, variant, repeat)
    path.mkdir(parents=True)
    with open(path / "evals.csv", "w", newline="") as f:
        csv.writer(f).writerows([("wall_time", "step", "eval_loss", "eval_accuracy"), *evals])
    (path / "summary.json").write_text(json.dumps({  # json.dumps writes NaN, as build_summary's does
        "mode": variant, "wall_seconds": 10.0, "samples_per_second": 100.0, "final_loss": final_loss,
        "eval_accuracy": evals[-1][3], "updates_applied": 3, "mean_staleness": 0.0, "max_staleness": 0}))


def test_a_diverged_repeat_is_counted_and_never_reaches_the_target(tmp_path):
    spec = spec_from_dict({"name": "div", "job": {"name": "digits_mlp", "steps": 3}, "seeds": [0, 1, 2],
                           "target": {"eval_accuracy": 0.9}, "variants": [{"mode": "sync"}, {"mode": "async"}]})
    # sync's final losses 2.0, 2.2 and NaN; its repeat 2 met the target at 1 s, then diverged
    _run(tmp_path, "sync", 0, 2.0, [(1.0, 1, 2.5, 0.5), (2.0, 2, 2.0, 0.95)])
    _run(tmp_path, "sync", 1, 2.2, [(1.0, 1, 2.6, 0.5), (3.0, 2, 2.2, 0.92)])
    _run(tmp_path, "sync", 2, NAN, [(1.0, 1, 1.9, 0.93), (3.0, 2, NAN, 0.1)])
    for rep in range(3):
        _run(tmp_path, "async", rep, 2.1, [(1.0, 1, 2.4, 0.6), (4.0, 2, 2.1, 0.91)])
    for variant, seed, repeat in spec.runs():
        write_config(run_dir(tmp_path, variant.name, repeat) / "config.json", spec.run_config(variant, seed))
    collect(tmp_path, spec)
    sync = {row["variant"]: row for row in read_csv(tmp_path / "summary.csv")}["sync"]
    assert sync["final_loss"] == "", sync  # not 2.1 (± 0.14) of the two that did not diverge
    assert (sync["repeats"], sync["diverged"], sync["target_reached"]) == ("3", "1", "2"), sync
    assert sync["time_to_target_seconds"] == "", sync  # repeat 2's 1.0 s does not count
    runs = [(r["variant"], r["repeat"], r["diverged"], r["reached_target"]) for r in read_csv(tmp_path / "runs.csv")]
    assert runs[:3] == [("sync", "0", "0", "1"), ("sync", "1", "0", "1"), ("sync", "2", "1", "0")], runs
    assert [s.diverged for s in read_summary(tmp_path)] == [1, 0]

    text = write_report(tmp_path, spec, spec_path="div.toml", versions={"psrv": "0"}).read_text()
    [row] = [line for line in text.splitlines() if line.startswith("| `sync` | sync |")]
    cells = row.split(" | ")
    assert cells[3] == "3 (1 diverged)" and cells[6] == "diverged (1/3)", row
    assert cells[8] == "not reached (2/3; 1 diverged)", row
    assert "`async` wins" in text or "`async` reached the target" in text, text
    assert "`sync` (2/3 repeats, 1 diverged)" in text, text


def test_a_failed_run_is_counted_and_named_in_the_report(tmp_path):
    """A run the runner recorded as failed (its error.txt, no finished summary): in no mean, and said: the repeats
    cell, summary.csv's `failed`, and a section with each failure's first and last line (once "no runs")."""
    spec = spec_from_dict({"name": "fail", "job": {"name": "digits_mlp", "steps": 3}, "seeds": [0, 1, 2],
                           "target": {"eval_accuracy": 0.9}, "variants": [{"mode": "sync"}, {"mode": "async"}]})
    _run(tmp_path, "sync", 0, 2.0, [(1.0, 1, 2.5, 0.5), (2.0, 2, 2.0, 0.95)])
    for rep in (1, 2):  # as experiments/harness/runner.py records a failure, beside the incomplete summary psrv run left
        path = run_dir(tmp_path, "sync", rep)
        path.mkdir(parents=True)
        (path / "summary.json").write_text(json.dumps({"complete": False, "cause": "worker-1 exited"}))
        (path / "error.txt").write_text("worker-1 exited with code 1; its output: w.log\nits last lines:\n"
                                        "a line\npsrv worker: shard 0: NONFINITE: refused\n")
    for rep in range(3):
        path = run_dir(tmp_path, "async", rep)
        path.mkdir(parents=True)
        (path / "error.txt").write_text("psrv run: timed out\n")
    for variant, seed, repeat in spec.runs():
        write_config(run_dir(tmp_path, variant.name, repeat) / "config.json", spec.run_config(variant, seed))
    collect(tmp_path, spec)
    rows = {row["variant"]: row for row in read_csv(tmp_path / "summary.csv")}
    assert (rows["sync"]["repeats"], rows["sync"]["failed"], rows["sync"]["final_loss"]) == ("1", "2", "2")
    assert (rows["async"]["repeats"], rows["async"]["failed"]) == ("0", "3")
    assert [s.failed for s in read_summary(tmp_path)] == [2, 3]

    text = write_report(tmp_path, spec, spec_path="fail.toml", versions={"psrv": "0"}).read_text()
    cells = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines() if line.startswith("| `")}
    assert cells["| `sync`"][3] == "1 (2 failed)" and cells["| `async`"][3] == "0 (3 failed)", cells
    assert cells["| `async`"][8] == "3 failed", cells  # was "no runs"
    assert "## Failed runs\n\n5 run(s) failed" in text, text
    assert ("- `sync` rep-1 (seed 1): worker-1 exited with code 1; its output: w.log ... psrv worker: shard 0: "
            "NONFINITE: refused") in text, text
    assert "- `async` rep-2 (seed 2): psrv run: timed out\n" in text, text
