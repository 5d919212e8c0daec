"""The conformance matrix's cases over torch RPC (test_matrix.py holds the checks): each runs as `psrv run
--transport rpc` runs it (experiments/launcher/launch.py run_local, called here), the shipped worker loop in its own
processes, seconds a case (one RPC world per process), so they are files of their own, which `make test` runs
beside the others: this one holds the even cases and test_rpc_matrix_odd.py the odd ones (pytest-xdist's
--dist loadfile hands out whole files, and one file of all 20 was the longest of the suite, 158 s)."""
from __future__ import annotations

import json

import pytest
import torch

from psrv.experiments.launcher.launch import run_local
from tests.conformance.axes import case_id, run_config, workers_of
from tests.conformance.cluster import BackupRecord, Outcome
from tests.conformance.test_matrix import PAIRS, check, one_thread  # noqa: F401 (one torch thread here too)


RPC_CASES = [c for c in PAIRS if c["transport"] == "rpc"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", RPC_CASES[0::2], ids=case_id)
def test_rpc_pairs(case, tmp_path, monkeypatch):
    run_rpc_case(case, tmp_path, monkeypatch)


def run_rpc_case(case, tmp_path, monkeypatch) -> None:
    """torch RPC needs a process per member of its world: these run as `psrv run --transport rpc` runs them,
    the shipped worker loop in its own processes (forked from the run's fork server where there are more
    than cores), against the in-process run of the same case over zmq. The launcher is this process: a
    `psrv run` process of its own would import torch again for the case's job, seconds a case."""
    # stays slow (seconds a case): one RPC world per process; 20 cases cover the live pairs
    out = tmp_path / "run"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_local(run_config(case), out=out, progress=False, timeout=100)
    shards = [json.loads((out / f"server-{s}.json").read_text()) for s in range(case["shards"])]
    records = {r: json.loads((out / f"worker-{r}.json").read_text()) for r in range(workers_of(case))}
    steps = {r: record["step_log"] for r, record in records.items()}
    wire = {r: {k: record[k] for k in ("bytes_pushed", "dense_push_bytes")} for r, record in records.items()}
    backups = [BackupRecord(shard=b["shard"], address=b["address"], summary=b, state=None, primary_state=None)
               for b in map(json.loads, (p.read_text() for p in sorted(out.glob("backup-*-*.json"))))]
    check(case, Outcome(params=torch.load(out / "params.pt"), shards=shards, steps=steps, backups=backups, wire=wire))
