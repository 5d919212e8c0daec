"""`psrv top` against a live server on 127.0.0.1: it names the shard, its version and its rate."""
import re
import socket
import subprocess
import time

import pytest

from psrv.cli.top import COLUMNS, Poll, format_table, rows
from tests.helpers import ROOT, psrv_argv


def _top(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run(psrv_argv("top", *args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_top_once_shows_a_training_shard(procs, tmp_path):
    server, address = procs.server("server", "--workers", "1", "--mode", "async")
    progress = tmp_path / "worker.progress"
    procs.start("worker", "worker", "--servers", address, "--steps", "100000", "--progress-file", str(progress))
    deadline = time.monotonic() + 60
    while not (progress.exists() and progress.read_text().strip() not in ("", "0")):
        assert server.poll() is None, procs.log("server")
        assert time.monotonic() < deadline, f"worker made no progress; log:\n{procs.log('worker')[-3000:]}"
        time.sleep(0.2)

    done = _top("--servers", address, "--once", "--interval", "0.5")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.strip().splitlines()
    assert header.split()[:2] == ["shard", "address"]
    cells = re.split(r"\s{2,}", row.strip())
    got = dict(zip([c for c in re.split(r"\s{2,}", header.strip())], cells))
    assert got["shard"] == "0" and got["address"] == address and got["mode"] == "async"
    assert int(got["version"]) >= 10                  # the worker had pushed at least 10 steps
    assert got["active"] == "1/1"
    assert float(got["updates/s"]) > 0                # still training between the two polls
    assert server.poll() is None                      # STATS from a non-worker leaves the shard alone


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
