"""`python -P -m psrv.cli.zygote SOCKET`: a process that imports what a fork server imports (torch, psrv's server and
worker code; psrv/cli/forkserver.py) once, then forks a ready fork server for each run's launcher that asks, so
that many runs in a row (a test suite, a sweep) pay for one import of torch, not one per run (about 1.4 s of CPU
each on this 2-core machine). The fork server it forks runs the loop a launcher's own runs (forkserver.serve_socket),
and a run's processes are forked from it as they are from that one.

A launcher uses it where the environment names its socket (PSRV_ZYGOTE=SOCKET; experiments/launcher/forkserver.py),
and starts its own fork server where it cannot reach it. It asks over SOCKET: one JSON line, {"log": the fork
server's output, "cwd": the launcher's folder, "env": its environment}, with the fork server's end of the
launcher's socket pair and the fds the run's processes inherit (the run folder's lock) passed beside it
(SCM_RIGHTS). It answers {"forked": PID}. The fork server forked runs in a session of its own, as the launcher's
would, and ends when the launcher closes its end of the pair or dies (the end of the pair's stream), ending what
it forked (SIGTERM); it also ends when this process does (its death signal).

This process ends on SIGTERM, or when the process that started it dies. It never starts a thread (a fork copies
one); should one exist after the imports, it prints why and exits 1 before it listens.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys

from psrv.cli.forkserver import die_with_parent, output_to, preload, serve_socket, threads_now
from psrv.experiments.launcher.forkserver import ZYGOTE


def _forked_server(request: dict, fds: list[int], zygote: int) -> None:
    """In the forked child: become the launcher's fork server over fds[0]; never returns."""
    code = 1
    try:
        os.setsid()  # as the launcher's own, started with start_new_session
        die_with_parent(zygote)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        output_to(request["log"])
        os.chdir(request["cwd"])
        from setproctitle import setproctitle
        setproctitle(f"{sys.executable} -P -m psrv.cli.forkserver {fds[0]}")  # what ps shows: a run's fork server
        os.environ.clear()
        os.environ.update(request["env"])
        code = serve_socket(socket.socket(fileno=fds[0]))  # fds[1:], the run lock, stay open: children inherit them
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001: said in its log, exit code 1
        import traceback
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not SystemExit: that would unwind through the zygote's loop, whose `finally` removes its socket


def serve(path: str) -> int:
    """Listen on the unix socket `path` and fork a fork server for each launcher that asks."""
    die_with_parent(None)  # ends with the process that started it
    preload()
    if threads_now() != 1:
        print(f"psrv zygote: {threads_now()} threads after the imports; a fork would copy one", file=sys.stderr)
        return 1
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # only now: a launcher that comes earlier starts its own fork server
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    me = os.getpid()
    try:
        while not stopped:
            for _ in selector.select(timeout=0.2):
                conn, _ = listener.accept()
                fds: list[int] = []
                try:
                    with conn:
                        conn.settimeout(10)
                        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 16)
                        while data and not data.endswith(b"\n"):
                            more = conn.recv(1 << 20)
                            if not more:
                                break
                            data += more
                        try:
                            doc = json.loads(data)
                            request = {key: doc[key] for key in ("log", "cwd", "env")}
                        except (ValueError, KeyError, TypeError) as exc:
                            conn.sendall((json.dumps({"refused": f"not a request: {exc}"}) + "\n").encode())
                            continue
                        if not fds:
                            conn.sendall(b'{"refused": "no socket came with the request"}\n')
                            continue
                        pid = os.fork()
                        if pid == 0:
                            selector.close()
                            listener.close()
                            conn.close()
                            _forked_server(request, fds, me)
                        conn.sendall((json.dumps({"forked": pid}) + "\n").encode())
                except OSError:  # the launcher went away meanwhile: its fork server sees its end closed
                    pass
                finally:
                    for fd in fds:
                        os.close(fd)
            while True:  # reap the fork servers that ended
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
    finally:
        listener.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -P -m psrv.cli.zygote", description=__doc__.split("\n\n")[0])
    p.add_argument("socket", help=f"the unix socket to listen on (must not exist); launchers find it in {ZYGOTE}")
    a = p.parse_args(argv)
    if os.path.exists(a.socket):
        p.error(f"{a.socket} exists: another zygote may listen there (remove it if none does)")
    return serve(a.socket)


if __name__ == "__main__":
    sys.exit(main())
