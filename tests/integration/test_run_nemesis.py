"""`psrv run --nemesis SPEC`: a run whose schedule pauses worker 1 for 1 s and the launcher for 1 s finishes,
the pauses in DIR/nemesis.jsonl and in summary.json's faults.nemesis, worker 1's steps stopped meanwhile."""
from __future__ import annotations

import csv
import json

import pytest

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.launch import run_local
from psrv.experiments.launcher.summary import format_summary

STEPS = 60
SCHEDULE = "pause worker:1 at step 10 for 1s; pause launcher at step 20 for 1s"


@pytest.mark.timeout(120)
def test_a_run_under_a_nemesis_finishes_with_its_faults_recorded(tmp_path):
    cfg = from_dict(RunConfig, {"mode": "async", "cluster": {"servers": 1, "workers": 2},
                                # 80 ms a step: worker 1 is still stepping when the launcher, slow to start
                                # on a loaded machine, sees step 10 and pauses it (30 ms once let it finish first)
                                "job": {"name": "digits_mlp", "steps": STEPS}, "faults": {"compute_ms": 80.0},
                                "nemesis": {"schedule": SCHEDULE}})
    summary = run_local(cfg, out=tmp_path, progress=False, timeout=100)
    assert summary["complete"]

    lines = [json.loads(line) for line in (tmp_path / "nemesis.jsonl").read_text().splitlines()]
    faults = [line for line in lines if line["ev"] == "fault"]
    assert [(f["kind"], f["target"], f["processes"], f["done"]) for f in faults] == [
        ("pause", "worker:1", ["worker-1"], True), ("pause", "launcher", ["launcher"], True)]
    assert sorted(line["id"] for line in lines if line["ev"] == "healed" and line["healed"]) == [1, 2]
    assert faults[0]["step"] >= 10 and faults[1]["step"] >= 20

    block = summary["faults"]["nemesis"]
    assert block["schedule"] == SCHEDULE and (block["done"], block["not_done"], block["not_reached"]) == (2, 0, [])
    assert block["by_kind"] == {"pause": {"done": 2, "not_done": 0}}
    for fault in block["faults"]:
        assert fault["healed_t"] - fault["t"] >= 1.0, fault
    assert summary["faults"]["kills"] == [] and "nemesis" in format_summary(summary)

    with open(tmp_path / "steps.csv") as f:
        times = sorted(float(r["wall_time"]) for r in csv.DictReader(f) if r["worker"] == "1")
    assert len(times) == STEPS  # every step of the paused worker, after its pause
    assert max(b - a for a, b in zip(times, times[1:])) >= 0.9, "worker 1 made no step while it was stopped"
