"""`psrv top` against a live server on 127.0.0.1: it names the shard, its version and its rate.

`psrv top` is the real command in a process; the shard it watches is a psrv.Server served from a thread
of the test process, and the worker training on it a PSClient pushing from another thread: what is
tested is what top reads from a live shard, and the shard and worker being processes would cost two
imports of torch (about 4 s of CPU) for nothing top can see."""
import re
import socket
import subprocess
import threading
import time

import pytest
import torch

from psrv.cli import build_parser
from psrv.cli.top import COLUMNS, Poll, format_table, rows
from psrv.config import ServerConfig
from psrv.config.cli_args import config_from_args
from psrv.partition import ParamSpec, PartitionPlan
from psrv.server.run import Server
from psrv.client.psclient import PSClient
from tests.helpers import ROOT, psrv_argv


def _top(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run(psrv_argv("top", *args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


PLAN = PartitionPlan((ParamSpec("w", (1000,)),), 1)


class Pusher(threading.Thread):
    """Worker 0 of 1: HELLO, INIT, then pushes a gradient of ones until stopped, then LEAVE."""

    def __init__(self, address: str):
        super().__init__(name="pusher", daemon=True)
        self.address, self.pushes, self.error = address, 0, None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with PSClient([self.address], PLAN, worker=0, world_size=1, timeout=30) as c:
                c.hello()
                c.init(torch.zeros(PLAN.total))
                grad = torch.ones(PLAN.total)
                while not self.stopping.is_set():
                    c.push(grad, clock=0)
                    self.pushes += 1
                    time.sleep(0.002)  # a steady rate, not a busy loop that starves top on 2 cores
                c.leave()
        except Exception as exc:  # surfaced by the test
            self.error = exc


@pytest.mark.timeout(120)
def test_top_once_shows_a_training_shard():
    cfg = config_from_args(ServerConfig, build_parser().parse_args(
        ["serve", "--bind", "tcp://127.0.0.1:0", "--workers", "1", "--mode", "async", "--log-level", "WARNING"]))
    with Server(cfg).start() as server:
        address = server.address
        worker = Pusher(address)
        worker.start()
        try:
            deadline = time.monotonic() + 60
            while worker.pushes < 10:
                assert worker.error is None and worker.is_alive(), worker.error
                assert time.monotonic() < deadline, "the worker made no progress"
                time.sleep(0.05)

            done = _top("--servers", address, "--once", "--interval", "0.5")
            with pytest.raises(TimeoutError):         # STATS from a non-worker leaves the shard alone:
                server.join(0)                        # still serving
            assert worker.error is None and worker.is_alive(), worker.error
        finally:
            worker.stopping.set()
            worker.join(30)
        assert worker.error is None, worker.error
        assert server.join(30)["updates_applied"] == worker.pushes  # the shard served on to the worker's LEAVE
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.strip().splitlines()
    assert header.split()[:2] == ["shard", "address"]
    cells = re.split(r"\s{2,}", row.strip())
    got = dict(zip([c for c in re.split(r"\s{2,}", header.strip())], cells))
    assert got["shard"] == "0" and got["address"] == address and got["mode"] == "async"
    assert int(got["version"]) >= 10                  # the worker had pushed at least 10 steps
    assert got["active"] == "1/1"
    assert float(got["updates/s"]) > 0                # still training between the two polls


@pytest.mark.timeout(60)
def test_top_reports_an_unreachable_server_without_hanging():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                     # nothing listens here once closed
    started = time.monotonic()
    done = _top("--servers", f"tcp://127.0.0.1:{port}", "--once", "--timeout", "0.5")
    assert done.returncode == 1
    assert f"shard 0 at tcp://127.0.0.1:{port}: no answer within 0.5s" in done.stderr
    assert "no answer" in done.stdout
    assert time.monotonic() - started < 45            # interpreter start-up, not a hang


def _poll(at: float, version: int, applied: int) -> Poll:
    return Poll("tcp://h:1", at, stats={"shard": 1, "mode": "ssp", "version": version, "workers": 3,
                                         "active": [0, 2], "clocks": {"0": 4, "2": 7},
                                         "updates_applied": applied, "pushes": applied,
                                         "staleness_histogram": {"0": 1, "3": 3}, "wait_seconds": 1.25})


def test_rows_compute_rate_clocks_and_staleness():
    (row,) = rows([_poll(12.0, 50, 50)], [_poll(10.0, 30, 30)])
    cells = dict(zip(COLUMNS, row))
    assert cells["version"] == "50" and cells["active"] == "2/3"
    assert cells["clock min/max"] == "4/7" and cells["staleness mean/max"] == "2.25/3"
    assert cells["updates/s"] == "10.0" and cells["wait s"] == "1.2"
    (first,) = rows([_poll(10.0, 30, 30)])
    assert dict(zip(COLUMNS, first))["updates/s"] == "-"
    text = format_table(rows([_poll(1.0, 1, 1), Poll("tcp://x:2", 1.0, error="no answer")]))
    assert len(text.splitlines()) == 3 and text.splitlines()[2].endswith("no answer")


def test_rich_table_when_rich_is_installed():
    pytest.importorskip("rich")
    from rich.console import Console

    from psrv.cli.top import _rich_table
    console = Console(width=200, record=True)
    console.print(_rich_table(rows([_poll(1.0, 7, 7)]), "psrv top"))
    text = console.export_text()
    assert "tcp://h:1" in text and "ssp" in text
