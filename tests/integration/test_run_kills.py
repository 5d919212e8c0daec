"""psrv run's own faults (experiments/launcher/kills.py): --kill-server SIGKILLs a shard at worker 0's step; with
--checkpoint-every the launcher restarts it from its checkpoint on its address and the run finishes, the
summary saying the kill, the restart and the clocks lost; without it the run ends with one line saying so."""
from __future__ import annotations

import csv
import json
import re

import pytest

from psrv.config import from_dict, RunConfig
from psrv.experiments.launcher.cluster import RunFailed
from psrv.experiments.launcher.launch import run_local
from psrv.experiments.launcher.summary import format_summary

STEPS = 120


def _config(**more) -> RunConfig:
    return from_dict(RunConfig, {"mode": "sync", "cluster": {"servers": 2, "workers": 2},
                                 "job": {"name": "digits_mlp", "steps": STEPS}, "faults": {"compute_ms": 10.0},
                                 "server": {"worker_timeout": 10.0}, **more})


def test_a_killed_shard_comes_back_from_its_checkpoint_and_the_run_finishes(tmp_path):
    cfg = _config(kill={"server": "1:60"}, checkpoints={"every": 0.5})
    summary = run_local(cfg, out=tmp_path, progress=False, timeout=180)

    faults = summary["faults"]
    [kill] = faults["kills"]
    assert kill["process"] == "server-1" and kill["killed"] and kill["signal"] == "SIGKILL"
    assert 60 <= kill["step"] < STEPS and kill["wall_s"] > 0
    [restart] = faults["restarts"]
    assert restart["process"] == "server-1" and restart["exit_code"] == -9 and "--kill-server 1:60" in restart["cause"]
    assert (tmp_path / "server-1.log.1").exists()  # the killed life's log is kept beside the new one's

    s0, s1 = (json.loads((tmp_path / f"server-{i}.json").read_text()) for i in range(2))
    lost = s1["lost_clocks"]
    print(f"\nshard 1 killed at worker 0's step {kill['step']}, resumed from version {s1['resumed_from']}, "
          f"{lost} clocks lost")
    assert faults["lost_clocks"] == {"1": lost} and faults["lost_clocks_total"] == lost
    assert faults["lost_updates"] == {"1": lost}
    assert faults["resumed_from"] == {"1": s1["resumed_from"]}
    assert 0 < s1["resumed_from"] <= kill["step"] + 20  # from before the kill (the step read lags by up to 10+)
    assert s0["version"] == STEPS and s0["resumed_from"] is None  # the other shard saw every clock
    assert s1["version"] == STEPS - lost                  # every clock after the restart, none twice

    with open(tmp_path / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    for rank in range(2):  # every worker's every step is in the run's table
        assert sorted(int(r["step"]) for r in rows if r["worker"] == str(rank)) == list(range(STEPS))
    assert summary["complete"] and summary["final_loss"] < summary["initial_loss"]
    table = format_summary(summary)  # what psrv run prints
    assert re.search(rf"^killed +server-1 at worker 0's step {kill['step']}$", table, re.M)
    assert re.search(rf"^restarted +server-1 from version {s1['resumed_from']}$", table, re.M)
    assert re.search(rf"^lost +shard 1: {lost} clocks, {lost} updates$", table, re.M)


def test_without_checkpoints_a_killed_shard_ends_the_run_with_one_line(tmp_path):
    # one shard: its death ends the run whatever their number (the other tests here need two)
    cfg = _config(kill={"server": "0:20"}, cluster={"servers": 1, "workers": 2},
                  job={"name": "digits_mlp", "steps": 400})
    with pytest.raises(RunFailed) as failed:
        run_local(cfg, out=tmp_path, progress=False, timeout=180)
    line = str(failed.value)
    assert "\n" not in line
    assert line.startswith("server-0 (shard 0) was killed by --kill-server 0:20 (SIGKILL at worker 0's step ")
    assert "without --checkpoint-every a dead shard ends the run" in line


def test_under_async_the_lost_updates_are_the_restarted_shards_shortfall(tmp_path):
    """Async has no clocks to skip (lost_clocks 0): what the restarted shard lost is counted against the
    shard that kept every push (each push goes to both)."""
    cfg = _config(mode="async", kill={"server": "0:40"}, checkpoints={"every": 0.5},
                  job={"name": "digits_mlp", "steps": 80})
    summary = run_local(cfg, out=tmp_path, progress=False, timeout=180)
    s0, s1 = (json.loads((tmp_path / f"server-{i}.json").read_text()) for i in range(2))
    assert s1["version"] == 2 * 80 and s0["resumed_from"] is not None  # shard 1 applied every push once
    lost = summary["faults"]["lost_updates"]["0"]
    print(f"\nasync: shard 0 resumed from version {s0['resumed_from']}, {lost} updates lost")
    assert lost == s1["version"] - s0["version"] >= 0 and summary["faults"]["lost_clocks"] == {"0": 0}


def test_a_killed_worker_is_left_behind_and_the_run_finishes(tmp_path):
    cfg = _config(kill={"worker": "1:40"}, cluster={"servers": 1, "workers": 2}, server={"worker_timeout": 2.0},
                  job={"name": "digits_mlp", "steps": 100})
    summary = run_local(cfg, out=tmp_path, progress=False, timeout=180)
    [kill] = summary["faults"]["kills"]
    assert kill["process"] == "worker-1" and kill["killed"] and 40 <= kill["step"] < 100
    assert summary["complete"] and summary["lost_workers"] == [1]
    assert summary["updates_applied"] == 100  # every clock applied once: the barrier went on without rank 1
    assert not (tmp_path / "worker-1.json").exists()  # killed: no record, so no rows of its own
    with open(tmp_path / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["step"]) for r in rows) == list(range(100)) and {r["worker"] for r in rows} == {"0"}
    assert re.search(r"^killed +worker-1 at worker 0's step \d+$", format_summary(summary), re.M)
