"""The fork server a run's launcher starts psrv processes from (experiments/launcher/forkserver.py): a forked `psrv ...`
exits as `python -m psrv.cli ...` would, its output in its log, its title its command line, a signal's end
reported as subprocess reports it, and no process outlives the fork server."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from psrv.experiments.launcher.forkserver import ForkServer

PSRV = [sys.executable, "-P", "-m", "psrv.cli"]


@pytest.mark.timeout(120)
def test_forked_psrv_commands_exit_print_and_die_as_their_own_processes(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = ForkServer(env, {"start_new_session": True}, log=str(tmp_path / "forkserver.log"))
    try:
        helped = server.start([*PSRV, "serve", "--help"], env, str(tmp_path / "help.log"))
        bad = server.start([*PSRV, "serve", "--no-such-option"], env, str(tmp_path / "bad.log"))
        assert helped.wait(30) == 0 and "usage: psrv serve" in (tmp_path / "help.log").read_text()
        assert bad.wait(30) == 2 and "unrecognized arguments: --no-such-option" in (tmp_path / "bad.log").read_text()
        argv = [*PSRV, "serve", "--mode", "async", "--workers", "1", "--bind", "tcp://127.0.0.1:0"]
        killed, left = (server.start(argv, env, str(tmp_path / f"{n}.log")) for n in ("killed", "left"))
        deadline = time.monotonic() + 30
        while b"--bind" not in Path(f"/proc/{left.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        title = Path(f"/proc/{left.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
        assert title == " ".join(argv)  # what ps shows: the command it stands for
        assert killed.poll() is None and left.poll() is None
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(30) == -signal.SIGKILL
    finally:
        server.close()  # the launcher is done: what is left gets SIGTERM
    deadline = time.monotonic() + 30
    while not _ended(left.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ended(left.pid)


def _ended(pid: int) -> bool:
    """Gone, or a zombie its new parent (init, here) has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"
