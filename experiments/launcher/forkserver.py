"""A local run's psrv processes forked from one that has imported torch already (psrv/cli/forkserver.py), instead of
each starting Python and importing torch itself: on 2 cores a run's six processes importing torch at once took
seconds of the run's start. experiments/launcher/cluster.py starts its `python -P -m psrv.cli` processes and the
all-reduce baselines' ranks (`python -P -m psrv.workers.allreduce`) through it when it can (on emulated hosts each
child enters its host's network namespace itself; not under a scheduler, not a user's script, which runs as its own `python FILE.py`), and each is a ForkedProcess:
subprocess.Popen's poll, wait, returncode, send_signal and kill, which the launcher uses.

Where PSRV_ZYGOTE names a zygote's socket (psrv/cli/zygote.py: torch imported once for many runs; the test suite
starts one per test process), the fork server is forked from it rather than started, and is the same loop; where
the zygote cannot be reached, the launcher starts its own.
"""
from __future__ import annotations

import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time


FORKABLE = ("psrv.cli", "psrv.workers.allreduce")  # the modules a forked child runs, as `python -P -m MODULE ARGS`
ZYGOTE = "PSRV_ZYGOTE"  # a zygote's socket (psrv/cli/zygote.py): the fork server is forked from it, torch imported


class ForkServerGone(RuntimeError):
    """The fork server ended or refused (it had threads after its imports): start processes with Popen."""


class ForkServer:
    """The fork server of one run, started with `popen_options` (the launcher's session, death signal and
    inherited fds); `env`: its environment (OMP_NUM_THREADS 1 there: each child sets its own count)."""

    def __init__(self, env: dict[str, str], popen_options: dict, *, log: str, timeout: float = 60.0):
        ours, theirs = socket.socketpair()
        env = {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        zygote = os.environ.get(ZYGOTE)
        self.proc = _from_zygote(zygote, theirs, popen_options, env, log) if zygote else None
        if self.proc is None:
            options = {**popen_options, "pass_fds": (*popen_options.get("pass_fds", ()), theirs.fileno())}
            with open(log, "w") as out:
                self.proc = subprocess.Popen([sys.executable, "-P", "-m", "psrv.cli.forkserver", str(theirs.fileno())],
                                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, **options)
        theirs.close()
        self.sock, self.buffer, self.codes, self.closed = ours, b"", {}, False
        self.selector = selectors.DefaultSelector()
        self.selector.register(ours, selectors.EVENT_READ)
        first = self._next(timeout)
        if first.get("ready") is not True:
            self.close()
            raise ForkServerGone(first.get("unsafe") or f"it answered {first}")

    def _read(self, timeout: float) -> bool:
        """Read what has come, waiting at most `timeout` s; False once the fork server is gone."""
        if not self.selector.select(timeout):
            return True
        data = self.sock.recv(1 << 16)
        self.buffer += data
        return bool(data)

    def _messages(self):
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            message = json.loads(line)
            if "exited" in message:
                self.codes[message["exited"]] = message["code"]
            else:
                yield message

    def _next(self, timeout: float) -> dict:
        """The next message that is not a child's end (those are kept in `codes`)."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self._messages():
                return message
            if time.monotonic() > deadline or not self._read(max(0.0, deadline - time.monotonic())):
                raise ForkServerGone("the fork server did not answer" if self.proc.poll() is None else
                                     f"the fork server ended (exit code {self.proc.returncode})")

    def poll(self) -> None:
        """Take in every child's end reported so far (none once closed)."""
        if self.closed:
            return
        while self.selector.select(0) and self._read(0):
            pass
        for _ in self._messages():  # nothing but ends comes unasked
            pass

    def start(self, argv: list[str], env: dict[str, str], log: str, *, cwd: str | None = None,
              netns: str = "") -> "ForkedProcess":
        """`argv` (python -P -m MODULE ARGS, MODULE psrv.cli or psrv.workers.allreduce) forked with `env`, its
        output to `log`, in the folder `cwd` (default: this process's), in the network namespace `netns` (an
        emulated host's; "": this process's)."""
        request = {"module": argv[3], "args": argv[4:], "argv": argv, "env": env, "log": log,
                   "cwd": cwd or os.getcwd(), "netns": netns}
        self.sock.sendall((json.dumps(request) + "\n").encode())
        answer = self._next(30.0)
        if "started" not in answer:
            raise ForkServerGone(f"it answered {answer}")
        return ForkedProcess(self, answer["started"], argv)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """End the fork server (its children are ended or stopped by then)."""
        self.closed = True
        try:
            self.selector.close()  # an epoll fd: a launcher in a long-lived process (a test's) starts many runs
            self.sock.close()
        finally:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _from_zygote(path: str, theirs: socket.socket, popen_options: dict, env: dict[str, str], log: str):
    """The fork server forked by the zygote at `path` over `theirs`, with the fds `popen_options` passes (the run
    folder's lock), as a ZygoteChild; None where the zygote cannot be reached or refuses (the launcher then starts its
    own). The launcher's death reaches it as the end of `theirs`' stream, not as a death signal."""
    request = {"log": os.path.abspath(log), "cwd": os.getcwd(), "env": env}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(path)
            socket.send_fds(conn, [(json.dumps(request) + "\n").encode()],
                            [theirs.fileno(), *popen_options.get("pass_fds", ())])
            answer = b""
            while not answer.endswith(b"\n"):
                more = conn.recv(1 << 16)
                if not more:
                    return None
                answer += more
        pid = json.loads(answer).get("forked")
        return ZygoteChild(pid) if isinstance(pid, int) else None
    except (OSError, ValueError):
        return None


class ZygoteChild:
    """A fork server the zygote forked, watched through its pidfd as a subprocess.Popen would be (its exit code is
    the zygote's to read: -1 here once it has ended)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None
        self.fd = os.pidfd_open(pid)
        self._ended = select.poll()  # not select.select: a test process may hold more than 1024 fds
        self._ended.register(self.fd, select.POLLIN)

    def _over(self, timeout: float | None) -> bool:
        if self.returncode is None and self._ended.poll(None if timeout is None else int(timeout * 1000)):
            self.returncode = -1
            os.close(self.fd)
        return self.returncode is not None

    def poll(self) -> int | None:
        self._over(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._over(timeout):
            raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            signal.pidfd_send_signal(self.fd, signal.SIGKILL)


class ForkedProcess:
    """A process the fork server forked, as the launcher uses a subprocess.Popen."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]):
        self.server, self.pid, self.args, self.returncode = server, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.poll()
            if self.pid in self.server.codes:
                self.returncode = self.server.codes[self.pid]
            elif not self.server.alive():  # its children got SIGTERM (their death signal) with it
                self.server.poll()
                self.returncode = self.server.codes.get(self.pid, -15)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)
