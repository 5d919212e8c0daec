"""psrv serve and psrv worker started by hand take their share of the host's cores as torch threads, as
the processes psrv run starts do (OMP_NUM_THREADS = cores / processes), and --help says so."""
from __future__ import annotations

import contextlib
import io
import re

import pytest

from psrv.cli import build_parser
from psrv.process import cores_each, usable_cores

SAID = re.compile(r"torch threads (\d+) \((.*)\)")


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_help_says_how_the_thread_count_is_chosen(command):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = " ".join(out.getvalue().split())
    assert "--threads N torch's threads in this process" in text
    assert "0: OMP_NUM_THREADS where it is set" in text
    assert "else this host's cores / the psrv serve and psrv worker processes running on it" in text
    assert "(default: 0)" in text


def _said(log: str) -> tuple[int, str]:
    found = SAID.findall(log)
    assert len(found) == 1, log[-3000:]
    return int(found[0][0]), found[0][1]


@pytest.mark.timeout(60)
def test_a_worker_started_by_hand_runs_with_its_share_of_the_cores(procs, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # as in a user's shell: nothing set
    server, address = procs.server("server", "--workers", "2", "--mode", "sync")
    # the shard listens (it is running) before either worker starts: each counts at least itself and it
    workers = [procs.start("worker-0", "worker", "--servers", address, "--rank", "0", "--world-size", "2",
                           "--steps", "5"),
               procs.start("worker-1", "worker", "--servers", address, "--rank", "1", "--world-size", "2",
                           "--steps", "5", "--threads", "3")]
    for p in [*workers, server]:
        assert procs.wait(p, timeout=50) == 0, procs.log(p.name)[-3000:]
    count, why = _said(procs.log("worker-0"))
    processes = int(re.fullmatch(rf"{usable_cores()} cores / (\d+) psrv processes on this host", why).group(1))
    assert processes >= 2 and count == cores_each(processes)  # 1 on 2 cores, where torch's own default is 2
    assert _said(procs.log("worker-1")) == (3, "--threads")
    count, why = _said(procs.log("server"))
    assert why.endswith("psrv processes on this host")
