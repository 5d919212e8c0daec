"""The fork server a run's launcher starts psrv processes from (experiments/launcher/forkserver.py): a forked `psrv ...`
exits as `python -m psrv.cli ...` would, its output in its log, its title its command line, a signal's end
reported as subprocess reports it, and no process outlives the fork server; the same of one a zygote forked
(psrv/cli/zygote.py), which also ends with its launcher, and is not needed: a launcher that cannot reach it starts
its own."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psrv.experiments.launcher.forkserver import ZYGOTE, ForkServer, ZygoteChild

PSRV = [sys.executable, "-P", "-m", "psrv.cli"]


@pytest.fixture(params=["own", "zygote"])
def started_by(request, monkeypatch, zygote) -> str:
    """Each test twice: the launcher's own fork server, and one forked from the suite's zygote (tests/conftest.py)."""
    if request.param == "own":
        monkeypatch.delenv(ZYGOTE, raising=False)
    elif zygote is None:
        pytest.skip("PSRV_TEST_ZYGOTE=0: no zygote in this run")
    else:
        _listening(zygote)
        monkeypatch.setenv(ZYGOTE, zygote)
    return request.param


def _listening(path: str) -> None:
    deadline = time.monotonic() + 60  # it imports torch first
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(path), "the zygote did not listen within 60 s"


@pytest.mark.timeout(120)
def test_forked_psrv_commands_exit_print_and_die_as_their_own_processes(tmp_path: Path, started_by: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = ForkServer(env, {"start_new_session": True}, log=str(tmp_path / "forkserver.log"))
    assert isinstance(server.proc, ZygoteChild) == (started_by == "zygote")
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


LAUNCHER = """
import os, sys, time
from psrv.experiments.launcher.forkserver import ForkServer
env = {**os.environ, "OMP_NUM_THREADS": "1"}
server = ForkServer(env, {"start_new_session": True}, log=sys.argv[1] + "/forkserver.log")
argv = [sys.executable, "-P", "-m", "psrv.cli", "serve", "--mode", "async", "--workers", "1",
        "--bind", "tcp://127.0.0.1:0"]
child = server.start(argv, env, sys.argv[1] + "/serve.log")
print(type(server.proc).__name__, server.proc.pid, child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_a_zygotes_fork_server_and_what_it_forked_end_when_their_launcher_is_killed(tmp_path: Path, zygote) -> None:
    if zygote is None:
        pytest.skip("PSRV_TEST_ZYGOTE=0: no zygote in this run")
    _listening(zygote)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, ZYGOTE: zygote})
    try:
        kind, server, child = launcher.stdout.readline().split()
        assert kind == "ZygoteChild"
        assert not _ended(int(server)) and not _ended(int(child))
        launcher.send_signal(signal.SIGKILL)  # no close(): the end of its socket is all the fork server sees
        launcher.wait(10)
        deadline = time.monotonic() + 30
        while not (_ended(int(server)) and _ended(int(child))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ended(int(server)) and _ended(int(child))
    finally:
        launcher.kill()
        launcher.wait()


def test_a_launcher_that_cannot_reach_its_zygote_starts_its_own_fork_server(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ZYGOTE, str(tmp_path / "nobody-listens"))
    server = ForkServer({**os.environ}, {"start_new_session": True}, log=str(tmp_path / "forkserver.log"))
    try:
        assert isinstance(server.proc, subprocess.Popen)
        helped = server.start([*PSRV, "serve", "--help"], dict(os.environ), str(tmp_path / "help.log"))
        assert helped.wait(30) == 0
    finally:
        server.close()


@pytest.mark.parametrize("sent", [b"not json\n", b'{"log": "x"}\n', b'{"log": "x", "cwd": "/", "env": {}}\n'])
def test_a_zygote_answers_a_malformed_request_with_why_and_goes_on(zygote, sent: bytes, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """Not JSON, a key missing, no socket passed beside it: refused, and the next launcher is served."""
    if zygote is None:
        pytest.skip("PSRV_TEST_ZYGOTE=0: no zygote in this run")
    _listening(zygote)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(zygote)
        conn.sendall(sent)
        assert "refused" in json.loads(conn.makefile().readline())
    monkeypatch.setenv(ZYGOTE, zygote)
    server = ForkServer({**os.environ}, {"start_new_session": True}, log=str(tmp_path / "forkserver.log"))
    server.close()
    assert isinstance(server.proc, ZygoteChild)


@pytest.mark.timeout(120)
def test_a_launcher_holding_over_1024_fds_starts_and_ends_its_fork_server_and_keeps_none_of_its_fds(
        tmp_path: Path, started_by: str) -> None:
    """A test process starts many runs and may hold more than select() can watch; each run's fds go with it."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the fd limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    padding = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(2):
            server = ForkServer(dict(os.environ), {"start_new_session": True}, log=str(tmp_path / "forkserver.log"))
            helped = server.start([*PSRV, "serve", "--help"], dict(os.environ), str(tmp_path / "help.log"))
            assert helped.wait(30) == 0
            server.close()
            assert server.proc.poll() is not None
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        for fd in padding:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_zygote_refuses_a_missing_or_taken_socket_in_one_line(tmp_path: Path) -> None:
    taken = tmp_path / "socket"
    taken.touch()
    for args, said in (([], "the following arguments are required: socket"), ([str(taken)], f"{taken} exists")):
        got = subprocess.run([sys.executable, "-P", "-m", "psrv.cli.zygote", *args], capture_output=True, text=True,
                             timeout=60)
        assert got.returncode == 2 and said in got.stderr.splitlines()[-1], got.stderr
