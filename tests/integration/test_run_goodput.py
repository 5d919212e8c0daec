"""`psrv run --nemesis SPEC --goodput-baseline DIR`: a run whose primary and then a worker are killed, the worker
brought back after its shard's first primary is gone (a backup took over), ends with summary.json's `goodput`
against a baseline and the history checker's verdict. The baseline is a fault-free run's folder written here (its
config.json the run's, its history one push every 10 ms per worker: 6400 samples/s), so one process cluster
starts, not two; tests/unit/test_goodput.py holds the arithmetic against written histories."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from psrv.config import RunConfig, from_dict, to_dict
from psrv.experiments.launcher.launch import run_local
from psrv.experiments.launcher.summary import format_summary

SCHEDULE = "kill primary:0 at step 20; kill worker:1 at step 60"


def _cfg(schedule: str) -> RunConfig:
    return from_dict(RunConfig, {"mode": "async", "cluster": {"servers": 1, "replicas": 1, "workers": 2},
                                 "job": {"name": "digits_mlp", "steps": 300}, "faults": {"compute_ms": 20.0},
                                 "server": {"worker_timeout": 3.0}, "restarts": {"workers": 1},
                                 "nemesis": {"schedule": schedule}})


def _fault_free(folder: Path, cfg: RunConfig, steps: int = 50) -> None:
    """A finished fault-free run of `cfg` as its folder holds it: config.json, and a history in which each worker
    pushes every 10 ms, each push applied by the one shard, then both leave."""
    (folder / "history").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(to_dict(cfg)))
    shard = [{"ev": "start", "t": 0.0, "role": "primary", "shard": 0, "address": "tcp://h:1", "pid": 1, "wall": 0.0},
             {"ev": "epoch", "t": 0.0, "epoch": 0, "role": "primary"}]
    for w in (0, 1):
        events = [{"ev": "start", "t": 0.0, "role": "worker", "w": w, "pid": 2 + w, "wall": 0.0}]
        for seq in range(1, steps + 1):
            t = 1.0 + 0.01 * seq
            events.append({"ev": "push", "t": t, "w": w, "seq": seq, "shard": 0, "clock": seq - 1, "to": "tcp://h:1"})
            shard.append({"ev": "apply", "t": t + 0.001, "w": w, "seq": seq, "clock": seq - 1, "version": 0, "epoch": 0})
        (folder / "history" / f"worker-{w}.{2 + w}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    shard += [{"ev": "member", "t": 1.0 + 0.01 * steps + 0.002, "w": w, "what": "leave"} for w in (0, 1)]
    (folder / "history" / "shard-0.1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in shard))


@pytest.mark.timeout(150)
def test_a_run_under_a_nemesis_reports_goodput_against_its_baseline_and_the_checkers_verdict(tmp_path):
    _fault_free(tmp_path / "base", _cfg(""))
    summary = run_local(_cfg(SCHEDULE), out=tmp_path / "run", progress=False, timeout=100,
                        baseline=tmp_path / "base")
    assert summary["complete"] and summary["faults"]["nemesis"]["done"] == 2
    restart, = summary["faults"]["worker_restarts"]  # the first primary was dead by then: its backup served
    assert restart["rank"] == 1 and restart["joined"]
    assert summary["history_check"]["ok"], summary["history_check"]

    g = summary["goodput"]
    assert g["baseline"]["run"] == str(tmp_path / "base") and g["baseline"]["differs"] == []
    assert g["baseline"]["samples_per_second"] == pytest.approx(2 * 32 / 0.01, rel=0.03)
    assert g["goodput"] == pytest.approx(g["samples_per_second"] / g["baseline"]["samples_per_second"], abs=1e-3)
    assert g["steps"]["pushed"] == g["steps"]["useful"] + g["steps"]["lost"] >= 2 * 300
    assert g["steps"]["twice"] == 0 and g["lost"]["acknowledged"] == 0  # the checker found none
    assert [(f["kind"], f["target"]) for f in g["faults"]] == [("kill", "primary:0"), ("kill", "worker:1")]
    # the faults' costs and the time before the first add up to what the span lost against the baseline's rate
    assert g["fault_cost_s"] == pytest.approx(g["span_s"] * (1 - g["goodput"]), abs=0.05)
    text = format_summary(summary)
    assert "goodput" in text and "history check       clean" in text
