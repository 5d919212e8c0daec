"""`psrv run --nemesis SPEC --goodput-baseline DIR`: a run whose primary and then a worker are killed, the worker
brought back after its shard's first primary is gone (a backup took over), ends with summary.json's `goodput`
against the same run without faults, and the history checker's verdict."""
from __future__ import annotations

import pytest

from psrv.config import RunConfig, from_dict
from psrv.experiments.launch import run_local
from psrv.experiments.summary import format_summary

SCHEDULE = "kill primary:0 at step 20; kill worker:1 at step 60"


def _cfg(schedule: str, steps: int) -> RunConfig:
    return from_dict(RunConfig, {"mode": "async", "cluster": {"servers": 1, "replicas": 1, "workers": 2},
                                 "job": {"name": "digits_mlp", "steps": steps}, "faults": {"compute_ms": 20.0},
                                 "server": {"worker_timeout": 3.0}, "restarts": {"workers": 1},
                                 "nemesis": {"schedule": schedule}})


@pytest.mark.timeout(150)
def test_a_run_under_a_nemesis_reports_goodput_against_its_baseline_and_the_checkers_verdict(tmp_path):
    run_local(_cfg("", 60), out=tmp_path / "base", progress=False, timeout=100)  # a baseline's length is free
    summary = run_local(_cfg(SCHEDULE, 300), out=tmp_path / "run", progress=False, timeout=100,
                        baseline=tmp_path / "base")
    assert summary["complete"] and summary["faults"]["nemesis"]["done"] == 2
    restart, = summary["faults"]["worker_restarts"]  # the first primary was dead by then: its backup served
    assert restart["rank"] == 1 and restart["joined"]
    assert summary["history_check"]["ok"], summary["history_check"]

    g = summary["goodput"]
    assert g["baseline"]["run"] == str(tmp_path / "base") and g["baseline"]["differs"] == []
    assert 0 < g["goodput"] < 1.5 and g["samples_per_second"] > 0
    assert g["steps"]["pushed"] == g["steps"]["useful"] + g["steps"]["lost"]
    assert g["steps"]["twice"] == 0 and g["lost"]["acknowledged"] == 0  # the checker found none
    assert [(f["kind"], f["target"]) for f in g["faults"]] == [("kill", "primary:0"), ("kill", "worker:1")]
    # the faults' costs and the time before the first add up to what the span lost against the baseline's rate
    assert g["fault_cost_s"] == pytest.approx(g["span_s"] * (1 - g["goodput"]), abs=0.05)
    text = format_summary(summary)
    assert "goodput" in text and "history check       clean" in text
