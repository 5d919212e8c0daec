"""A partitioned network: the link between a worker's host and the servers' host goes down mid sync run.

Three emulated hosts (deploy/netns/cluster.sh, on a net of their own): the shard on h0, rank 0 on h1, rank 1 on h2. Once both
have trained a few steps, h2's port on the bridge is set down (as a switch port or a cable would go): no
packet passes either way and neither side is told. The cut-off rank ends within its `--request-timeout`
with one line naming the shard, its address and the bound; the shard drops it after `--worker-timeout`
and names it; rank 0's sync barrier goes on without it and rank 0 finishes every step; every clock is
applied once.

Needs root and iproute2; skipped otherwise.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.system.test_netns import Hosts, emulated  # noqa: F401 (emulated: a fixture)

pytestmark = [pytest.mark.root, pytest.mark.slow]

STEPS = 200            # about 5 s of 25 ms steps, plus the barrier held WORKER_TIMEOUT: mid-run at the cut
CUT_AT = 20            # both ranks' progress files say this many steps, then h2's link goes down
WORKER_TIMEOUT = 3     # the shard drops a worker silent this long
REQUEST_TIMEOUT = 4    # the cut-off rank gives up after this long without a reply


@pytest.fixture
def three_hosts(tmp_path, emulated):
    """Hosts h0-h2 on the bridge, uncapped, their processes killed by PID, then the hosts removed."""
    hosts = Hosts(tmp_path, emulated)
    try:
        yield hosts
    finally:
        hosts.kill_all()


def _steps(progress: Path) -> int:
    try:
        return int(progress.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _wait_for(what: str, ready, hosts: Hosts, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for name, p in hosts.started.items():
            assert p.poll() is None, f"{name} exited early with {p.returncode}; log:\n{hosts.log(name)}"
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_worker_cut_off_by_the_network_ends_with_one_line_and_the_barrier_goes_on(three_hosts, tmp_path):
    # stays slow: it waits out the cut-off worker's --request-timeout and the shard's --worker-timeout, the
    # bounds it checks, with processes on three emulated hosts
    hosts = three_hosts
    address, h2_port = f"tcp://{hosts.emulated.address(0)}:5555", f"{hosts.emulated.names.veth}v2"  # cluster.sh's
    hosts.start(0, "server", "serve", "--bind", address, "--shard", "0", "--num-shards", "1", "--workers", "2",
                "--mode", "sync", "--worker-timeout", str(WORKER_TIMEOUT),
                "--ready-file", str(tmp_path / "server.addr"), "--out", str(tmp_path / "server.json"))
    _wait_for("the shard listening", (tmp_path / "server.addr").exists, hosts, 60)
    for rank, host, extra in ((0, 1, ()), (1, 2, ("--request-timeout", str(REQUEST_TIMEOUT)))):
        hosts.start(host, f"worker-{rank}", "worker", "--servers", address, "--rank", str(rank), "--world-size", "2",
                    "--job", "digits_mlp", "--steps", str(STEPS), "--compute-ms", "20", *extra,
                    "--progress-file", str(tmp_path / f"worker-{rank}.progress"),
                    "--out", str(tmp_path / f"worker-{rank}.json"))
    _wait_for(f"both ranks at step {CUT_AT}",
              lambda: min(_steps(tmp_path / f"worker-{r}.progress") for r in range(2)) >= CUT_AT, hosts, 60)

    subprocess.run(["ip", "link", "set", h2_port, "down"], check=True, capture_output=True, timeout=10)
    cut = time.time()
    cut_at_step = _steps(tmp_path / "worker-1.progress")
    cut_off = hosts.started["worker-1"]
    try:
        rc = cut_off.wait(REQUEST_TIMEOUT + 15)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"rank 1 still running {REQUEST_TIMEOUT + 15}s after its link went down; log:\n"
                             f"{hosts.log('worker-1')}") from None
    gave_up_after = time.time() - cut
    log1 = hosts.log("worker-1")
    assert rc != 0, log1
    assert "Traceback" not in log1, log1
    errors = [line for line in log1.splitlines() if line.startswith("psrv worker:")]
    assert len(errors) == 1, log1
    assert errors == log1.splitlines()[-1:], log1  # the last thing it says
    assert all(s in errors[0] for s in (address, "(shard 0)", f"within {REQUEST_TIMEOUT}s", "stopped answering",
                                        "network", "--request-timeout sets the bound")), errors[0]
    # the bound counts from its last reply, just before the cut; then it tries LEAVE for up to 2 s on its way out
    assert REQUEST_TIMEOUT - 0.5 <= gave_up_after <= REQUEST_TIMEOUT + 10, (gave_up_after, errors[0])

    gone = json.loads((tmp_path / "worker-1.json").read_text())  # the steps it did, said as failed: no weights
    assert "stopped answering" in gone["failed"] and gone["steps_done"] == len(gone["step_log"]) >= cut_at_step, gone
    assert "interrupted" not in gone
    del hosts.started["worker-1"]  # its exit is checked; the others must end with 0
    hosts.wait_all(timeout=60)
    server = json.loads((tmp_path / "server.json").read_text())
    rank0 = json.loads((tmp_path / "worker-0.json").read_text())
    record = {k: server[k] for k in ("version", "updates_applied", "duplicates", "clocks", "lost_workers",
                                     "active", "lost_clocks")}
    record.update(cut_at_step=cut_at_step, rank1_gave_up_after_s=round(gave_up_after, 2), error=errors[0])
    print(json.dumps(record))

    # the shard dropped rank 1 for its silence and said so
    assert server["lost_workers"] == [1], record
    assert "worker 1 silent for" in hosts.log("server"), hosts.log("server")
    # rank 0 finished every step, some of them after the shard let the barrier go on without rank 1
    assert len(rank0["step_log"]) == STEPS, record
    after = [r for r in rank0["step_log"] if r["wall_time"] > cut + WORKER_TIMEOUT]
    assert after, (record, rank0["step_log"][-1])
    # every clock applied once, none twice: the version is the clocks closed, one per rank-0 step
    assert server["version"] == server["updates_applied"] == STEPS == server["clocks"]["0"], record
    assert server["lost_clocks"] == 0, record
    assert cut_at_step <= server["clocks"]["1"] < STEPS, record
