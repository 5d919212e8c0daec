"""The history checker under the nemesis (docs/history.md, docs/reliability.md "The nemesis"): `psrv run` with
replicated shards in sync, async and ssp, with one and two backups, under a backup paused past the ack timeout,
a late ack, a primary paused past the takeover bound (fenced when it comes back) and a killed primary. Every
run's history must hold: each acknowledged push applied once in the final lineage, one primary per epoch, the
barrier and the bound, the summary's counts. A sync run under all of it ends with the weights of the run
without faults, bit for bit (two fault-free sync runs are equal bit for bit, so 10x their difference is 0)."""
from __future__ import annotations

import pytest
import torch

from psrv.experiments.launcher.history import check_run
from tests.helpers import psrv_run

# A step of about 20 ms. The kill comes first: the backup takes over, and the next faults, on a backup, wait (the
# nemesis holds a fault until the shard has a live backup) for the replacement the launcher starts (a process that
# imports torch: seconds), then the primary is paused past the takeover bound and fenced.
SCHEDULE = ("kill primary:0 at step 30; pause backup:0 at step 60 for 1s; late_ack backup:0 at step 90 for 1s; "
            "pause primary:0 at step 120 for 1s")
# The last fault is healed by about step 150 (a quiet run: 1 s of pause is 30 steps), and the run goes on 250 steps
# more, seconds in which the healed primary is fenced and the workers push through the new one.
STEPS = 400
JOB = ("--servers", "1", "--workers", "2", "--steps", str(STEPS), "--compute-ms", "20", "--failure-bound", "0.4",
       "--optimizer", "sgd", "--momentum", "0.9")


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory) -> torch.Tensor:
    out = tmp_path_factory.mktemp("fault-free")
    psrv_run(out, "--mode", "sync", *JOB)
    return torch.load(out / "params.pt")


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("mode", ["sync", "async", "ssp"])
def test_every_history_holds_under_pauses_a_late_ack_and_a_kill(mode, replicas, tmp_path, request):
    summary = psrv_run(tmp_path, "--mode", mode, *JOB, *(("--staleness", "2") if mode == "ssp" else ()),
                       "--replicas", str(replicas), "--nemesis", SCHEDULE, timeout=150)
    faults = summary["faults"]["nemesis"]["faults"]
    assert [(f["kind"], f["target"], f["done"] or f["why"]) for f in faults] == [
        ("kill", "primary:0", True), ("pause", "backup:0", True), ("late_ack", "backup:0", True),
        ("pause", "primary:0", True)], faults
    result = check_run(tmp_path)
    assert result.ok, result.line()
    assert result.counts.acknowledged == 2 * STEPS and result.counts.epochs >= 4  # a join, a takeover, ...
    if mode == "sync":
        assert torch.equal(torch.load(tmp_path / "params.pt"), request.getfixturevalue("fault_free"))
