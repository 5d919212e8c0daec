"""Identity and liveness mistakes are named, on 127.0.0.1: a second worker with a taken --rank (real
`psrv serve` and `psrv worker` processes), rank 0 gone before INIT and no server at the address (a
real `psrv worker`; the shard, where there is one, served from a thread of the test process), a
loop pushing a stale clock (this process's PSClient against a shard in a thread). Each one-line
error says what happened and what to change."""
from __future__ import annotations

import json
import logging
import socket
import time

import pytest
import torch

from psrv.cli import build_parser
from psrv.config import ServerConfig
from psrv.config.cli_args import config_from_args
from psrv.protocol import MsgType
from psrv.server.run import Server
from psrv.client.admin import admin_request
from psrv.client.psclient import PSClient
from psrv.partition import ParamSpec, PartitionPlan
from tests.helpers import psrv_argv, run_in_session

pytestmark = pytest.mark.timeout(240)
TIMEOUT = 2.0  # --worker-timeout of the servers here


def progress(path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def shard(*args: str) -> Server:
    """The shard `psrv serve ARGS` would serve, served from a thread of this process (started)."""
    cfg = config_from_args(ServerConfig, build_parser().parse_args(["serve", "--bind", "tcp://127.0.0.1:0", *args]))
    return Server(cfg).start()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_second_worker_with_a_taken_rank_is_refused_and_the_first_finishes(procs, tmp_path):
    # Stays slow (four processes, 150 steps of 100 ms): the refused rank is a real `psrv worker`, and the
    # first rank 1 must still be training while the twin starts, imports torch and is refused (its HELLO said
    # again for worker_timeout + 1 s). With 60 steps, on a loaded machine the run ended first 2 times in 16:
    # the twin's last HELLO then went to a shard that had finished, or the first rank 1 was done.
    steps = 150
    server, address = procs.server("server", "--workers", "2", "--mode", "sync", "--worker-timeout", str(TIMEOUT),
                                   "--out", str(tmp_path / "server.json"))
    common = ["worker", "--servers", address, "--world-size", "2", "--steps", str(steps), "--compute-ms", "100"]
    w0 = procs.start("worker-0", *common, "--rank", "0")
    w1 = procs.start("worker-1", *common, "--rank", "1", "--progress-file", str(tmp_path / "w1.progress"))
    deadline = time.monotonic() + 120
    while progress(tmp_path / "w1.progress") < 3:
        assert time.monotonic() < deadline and w1.poll() is None, procs.log("worker-1")
        time.sleep(0.05)
    started = time.monotonic()
    twin = procs.start("twin", *common, "--rank", "1")
    assert procs.wait(twin, timeout=60) == 1, procs.log("twin")
    refused_after = time.monotonic() - started
    assert w0.poll() is None and w1.poll() is None, "the first rank 1 must still be training"
    for p in (w0, w1, server):
        assert procs.wait(p, timeout=180) == 0, procs.log(p.name)

    out = procs.log("twin")
    last = out.strip().splitlines()[-1]
    assert last.startswith("psrv worker: shard 0: RANK_IN_USE: rank 1 is already in use by another live worker"), out
    assert "give each worker its own --rank" in last and "Traceback" not in out
    assert "says rank 1 is in use by another live worker; saying HELLO again for up to 3s" in out
    print(f"\nsecond rank 1 refused {refused_after:.1f}s after its start")
    assert refused_after < TIMEOUT + 1 + 30  # one worker_timeout of retries, plus start-up on a busy box
    assert "refused a request: RANK_IN_USE: rank 1 is already in use" in procs.log("server")
    shard = json.loads((tmp_path / "server.json").read_text())
    # the twin never touched rank 1's clock or the barrier: every clock committed once, with both
    assert shard["clocks"] == {"0": steps, "1": steps} and shard["updates_applied"] == steps
    assert shard["lost_workers"] == [] and shard["dropped"].get("late", 0) == 0


def test_rank_1_without_rank_0_says_it_waits_then_fails_within_the_bound(procs, tmp_path):
    with shard("--workers", "2", "--mode", "sync") as server:
        _rank_1_alone(procs, server.address)


def _rank_1_alone(procs, address: str) -> None:
    started = time.monotonic()
    w1 = procs.start("worker-1", "worker", "--servers", address, "--rank", "1", "--world-size", "2",
                     "--steps", "5", "--request-timeout", "3")
    assert procs.wait(w1, timeout=60) == 1, procs.log("worker-1")
    took = time.monotonic() - started
    out = procs.log("worker-1")
    assert "waiting for rank 0's initial weights (INIT) from shard(s) [0], at most 3s" in out
    last = out.strip().splitlines()[-1]
    assert last == ("psrv worker: worker 1: rank 0 never sent the initial weights within 3s "
                    "(is rank 0 running? --request-timeout sets the bound)"), out
    assert "Traceback" not in out
    assert took < 3 + 30  # the bound, plus start-up on a busy box (it used to wait forever)
    assert admin_request(address, MsgType.STATS, timeout=10.0)["shard"] == 0  # the shard still serves


def test_no_server_at_the_address_names_it_and_the_option(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = run_in_session(psrv_argv("worker", "--servers", address, "--rank", "0", "--world-size", "1",
                                    "--steps", "1", "--request-timeout", "2"), timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 1, done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last == (f"psrv worker: worker 0: no reply from {address} (shard 0) within 2s to HELLO; "
                    "is `psrv serve` running there? --request-timeout sets the bound"), done.stdout
    assert "Traceback" not in done.stdout and took < 2 + 30
    # while it waited it said so, naming the same flag (a line every 2/3 s of a 2 s bound)
    waiting = [line for line in done.stdout.splitlines() if f"no answer to HELLO yet from {address} (shard 0)" in line]
    assert len(waiting) >= 2 and all("giving up at 2s without one (--request-timeout sets the bound)" in line
                                     for line in waiting), done.stdout


def test_pushing_a_stale_clock_is_named_by_the_server_and_the_client(caplog):
    """The reproduction: a custom PSClient loop in sync mode that pushes clock 0 every step. Every
    push after the first is dropped as late; after 3 in a row both sides warn, the client once."""
    plan = PartitionPlan((ParamSpec("w", (10,)),), 1)
    weights, grad = torch.zeros(plan.total), torch.ones(plan.total)
    with caplog.at_level(logging.WARNING, logger="psrv.client.psclient"), \
            caplog.at_level(logging.WARNING, logger="psrv.server"), shard("--workers", "1", "--mode", "sync") as server:
        with PSClient([server.address], plan, worker=0, world_size=1, timeout=20) as client:
            welcomes = client.hello()
            client.init(weights)
            client.first_pull(welcomes, out=weights)
            replies = [client.push(grad, clock=0) for _ in range(8)]
            client.pull(clock=0, out=weights, final=True)
            client.leave()
        summary = server.join(timeout=30)  # the summary `psrv serve --out` writes; a failure is raised here
    dropped = [r.fields[0].get("dropped") for r in replies]
    assert dropped == [None] + ["late"] * 7
    warnings = [r.getMessage() for r in caplog.records
                if r.name.startswith("psrv.client") and "as late" in r.getMessage()]
    assert warnings == ["worker 0: shard 0 dropped 3 pushes of worker 0 as late: its clock 0 is behind the "
                        "shard's clock 1; push with the clock from the last reply"]
    log = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("psrv.server"))
    assert log.count("dropped 3 pushes of worker 0 in a row as late: it pushes clock 0, the shard is at clock 1") == 1
    assert summary["dropped"] == {"late": 7} and summary["updates_applied"] == 1
