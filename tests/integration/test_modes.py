"""Each mode on the default job, `psrv run`'s options and cluster on 127.0.0.1: it learns, and it counts
right. The shards and workers are threads of the test process (tests/threaded_run.py): these tests are
about what a run computes and counts, not about starting processes.

The counts are the servers' own (server-i.json, the summary `psrv serve --out` writes at exit), checked
against what the workers did: every worker pushes to every shard once per step.
"""
import csv
import json
from pathlib import Path

import pytest

from tests.threaded_run import threaded_run


def _shards(out: Path, n: int) -> list[dict]:
    """The n servers' own records, by shard."""
    shards = [json.loads((out / f"server-{i}.json").read_text()) for i in range(n)]
    assert [s["shard"] for s in shards] == list(range(n))
    return shards


def _check_push_counts(shard: dict, pushes: int) -> None:
    """Every push arrived, none was refused, dropped or re-sent."""
    assert shard["pushes"] == pushes, shard
    assert (shard["dropped"], shard["errors"], shard["lost_workers"]) == ({}, 0, []), shard
    assert sum(shard["staleness_histogram"].values()) == pushes   # a staleness for every push


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["sync", "async", "ssp"])
def test_default_job_learns_and_counts_updates(mode, tmp_path):
    s = threaded_run(tmp_path, "--mode", mode, timeout=120)   # the default run must finish in 2 minutes
    assert s["mode"] == mode and s["num_servers"] == 2 and s["num_workers"] == 2
    assert s["eval_accuracy"] >= 0.90, s
    assert s["final_loss"] < s["initial_loss"]
    steps, pushes = s["steps"], 2 * s["steps"]              # per shard: 2 workers x steps
    assert s["pushes"] == pushes                            # the workers' own count of steps pushed
    shards = _shards(tmp_path, 2)
    for shard in shards:
        _check_push_counts(shard, pushes)
        if mode == "sync":                                  # one step per clock, nothing stale
            assert shard["updates_applied"] == shard["version"] == steps, shard
            assert shard["staleness_histogram"] == {"0": pushes} and shard["max_clock_gap"] == 0
        else:                                               # one update per push, at once
            assert shard["updates_applied"] == shard["version"] == pushes, shard
        if mode == "ssp":
            assert shard["max_clock_gap"] <= shard["staleness"] == s["staleness"], shard
    with open(tmp_path / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * steps                           # one row per worker step
    # A step's staleness is the worst its shards replied: the workers' rows and the servers'
    # histograms see the same pushes from the two ends.
    assert max(int(r["staleness"]) for r in rows) == max(sh["max_staleness"] for sh in shards) \
        == s["max_staleness"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("bound", [0, 2])
def test_ssp_bound_holds_with_a_slow_worker(bound, tmp_path):
    s = threaded_run(tmp_path, "--mode", "ssp", "--staleness", str(bound), "--workers", "3", "--servers", "1",
                     "--steps", "40", "--straggler", "2:6", "--compute-ms", "3")
    # The recorded gap (clock of each answered pull minus the slowest active clock) never exceeds
    # the bound, and the fast workers did run into it: the slow worker really held them back.
    [shard] = _shards(tmp_path, 1)
    assert shard["max_clock_gap"] == s["max_clock_gap"] == bound, shard
    _check_push_counts(shard, 120)
    assert shard["updates_applied"] == shard["version"] == 120


@pytest.mark.timeout(150)
def test_async_runs_ahead_of_a_slow_worker(tmp_path):
    s = threaded_run(tmp_path, "--mode", "async", "--workers", "2", "--servers", "1", "--steps", "40",
                     "--straggler", "1:6", "--compute-ms", "3")
    [shard] = _shards(tmp_path, 1)
    assert shard["max_clock_gap"] == s["max_clock_gap"] and shard["max_clock_gap"] > 2, shard
    _check_push_counts(shard, 80)
    assert shard["updates_applied"] == shard["version"] == 80
