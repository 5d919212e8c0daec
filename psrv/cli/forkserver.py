"""`python -m psrv.cli.forkserver FD`: the fork server a local run's launcher starts first
(experiments/launcher/forkserver.py). It imports torch and psrv's server and worker code once, then forks each
`psrv serve` / `psrv worker` the launcher asks for, so a run's processes start in milliseconds instead of
each importing torch (about 2 s of CPU apiece, all at once on a run's start).

It talks over the socket FD, a JSON object a line. Asked {"module", "args", "argv", "env", "cwd", "log"} (and
"netns", an emulated host's network namespace, which the child enters first, as `ip netns exec` would), it
forks a child that runs `python -m MODULE ARGS` (`psrv ARGS`, psrv.cli.main, or an all-reduce rank,
psrv.workers.allreduce; FORKABLE) in a session of its own, its environment ENV, its output to LOG,
as `python -m psrv.cli ARGS` would, its process title ARGV (what ps shows: the command it stands for), and
answers {"started": PID}. Every child's end is sent as {"exited":
PID, "code": its return code as subprocess gives it (-N: killed by signal N)}. A child gets SIGTERM when
this process dies, and this one when the launcher does (its preexec), so nothing outlives the run.

It never starts a thread: a fork of a process with threads copies one of them. Should one exist after
the imports, it says so ({"unsafe": why}) and exits, and the launcher starts its processes itself.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import io
import json
import os
import selectors
import shlex
import signal
import socket
import sys
import traceback
from pathlib import Path

PRELOAD = ("torch", "setproctitle", "psrv.server.run", "psrv.workers.loop", "psrv.workers.jobs", "psrv.cli.main",
            # no job imports sklearn (digits reads its CSV: workers/jobs/digits.py)
            "psrv.cli.serve", "psrv.cli.worker",
            "psrv.workers.allreduce.main", "psrv.workers.allreduce.loop",
            # what every shard and worker imports once started (its transport, a worker's data and the weights'
            # file format): 36-42 ms of each child's start otherwise (docs/architecture.md, "Start-up")
            "psrv.transport.zmq", "psrv.transport.shm", "psrv.workers.data", "torch.utils.serialization")


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


def die_with_parent(parent: int | None) -> None:
    """SIGTERM to this process when its parent dies (PR_SET_PDEATHSIG); with `parent`, a SystemExit at once if it
    is no longer this process's parent (it died before the request was made)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, int(signal.SIGTERM))
    if parent is not None and os.getppid() != parent:
        raise SystemExit(128 + signal.SIGTERM)


def output_to(log: str) -> None:
    """This process's stdout and stderr to the file `log` (truncated), its stdin from /dev/null."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, fd in ((0, null), (1, out), (2, out)):
        os.dup2(fd, target)
    os.close(out)
    os.close(null)


CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000  # setns(2), unshare(2)
MS_RDONLY, MS_BIND, MS_REC, MS_SLAVE, MNT_DETACH = 1, 4096, 16384, 1 << 19, 2  # mount(2), umount2(2)


def enter_netns(name: str) -> None:
    """Move this process into the network namespace `name` (/run/netns/NAME, as `ip netns add` makes it) as `ip
    netns exec NAME` does (iproute2's netns_switch): the namespace, a mount namespace of its own in which /sys is
    the namespace's and each file of /etc/netns/NAME is bound over /etc's (deploy/netns/cluster.sh writes each
    host's hosts and resolv.conf there: without them a peer's reverse lookup waited 10 s for a resolver no host
    reaches). Before any thread starts (setns moves the calling thread, and the threads it starts after). OSError,
    naming it, where it cannot (not root, no such namespace)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot enter network namespace {name}: {what}: {os.strerror(err)}")

    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc.setns(fd, CLONE_NEWNET), "setns")
    finally:
        os.close(fd)
    check(libc.unshare(CLONE_NEWNS), "unshare")
    check(libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None), "mount --make-rslave /")
    readonly = MS_RDONLY if os.statvfs("/sys").f_flag & os.ST_RDONLY else 0
    if libc.umount2(b"/sys", MNT_DETACH) == 0:  # as iproute2: a /sys that will not go is left as it is
        check(libc.mount(name.encode(), b"/sys", b"sysfs", readonly, None), "mount /sys")
    etc = f"/etc/netns/{name}"
    for entry in sorted(os.listdir(etc)) if os.path.isdir(etc) else ():
        check(libc.mount(f"{etc}/{entry}".encode(), f"/etc/{entry}".encode(), b"none", MS_BIND, None),
              f"bind {etc}/{entry} over /etc/{entry}")


def _child(request: dict, sock: socket.socket, parent: int) -> None:
    """In the forked child: become `psrv ARGS`, and end by SystemExit out through serve(); never returns. In a
    fork server started as a process of its own, the child then ends as a Python process ends (exit handlers
    run, output flushed); in one the test suite's zygote forked (psrv/cli/zygote.py), the SystemExit unwinds to
    the zygote's `_forked_server`, which flushes the output and ends with os._exit: no exit handler runs."""
    code = 1
    try:
        os.setsid()
        die_with_parent(parent)  # the fork server
        sock.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        output_to(request["log"])
        if request.get("netns"):  # an emulated host's process (experiments/launcher/netns.py)
            enter_netns(request["netns"])
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True)
        from setproctitle import setproctitle
        setproctitle(shlex.join(request["argv"]))  # what ps and /proc/PID/cmdline show (before environ is replaced)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        threads = os.environ.get("OMP_NUM_THREADS", "").strip()
        if threads.isdigit() and int(threads) > 0:
            import torch
            torch.set_num_threads(int(threads))  # read once, at torch's import, in this server's environment
        from psrv.experiments.launcher.forkserver import FORKABLE
        module = request.get("module", "psrv.cli")
        if module not in FORKABLE:
            raise ValueError(f"the fork server runs {', '.join(FORKABLE)}; asked for {module!r}")
        if module == "psrv.cli":
            sys.argv = [str(Path(__file__).with_name("__main__.py")), *request["args"]]  # as `python -m psrv.cli`
            from psrv.cli.main import main
            code = main(request["args"])
        else:  # as `python -m MODULE ARGS`: its __main__ (psrv.workers.allreduce's ends in os._exit)
            import runpy
            sys.argv = [module, *request["args"]]  # runpy puts the file in argv[0]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001: whatever it was, it is this process's output and exit code 1
        traceback.print_exc()
        code = 1
    raise SystemExit(code)


def preload() -> None:
    """Import what every child needs, once, and keep it out of the collections; before any fork."""
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    from psrv.cli.main import build_parser
    build_parser()  # the config sections' field types resolved once, here, not in every child's parse
    from setproctitle import getproctitle, setproctitle
    setproctitle(getproctitle())  # set up here, where the environment is still the one it started with
    # what was imported stays out of every collection, here and in each child (the gc docs' advice before
    # fork): a child's collections, and the last one at its exit, would otherwise walk torch's objects,
    # copying each page they touch
    from psrv.process import freeze_imports
    freeze_imports()


def serve(fd: int) -> int:
    """The fork server's loop over socket `fd`: fork on each request, report each child's end."""
    sock = socket.socket(fileno=fd)
    preload()
    return serve_socket(sock)


def serve_socket(sock: socket.socket) -> int:
    """Fork on each request over `sock`, report each child's end, until the launcher closes its end or dies (then
    SIGTERM what is left); after preload(), in this process or a zygote's fork (psrv/cli/zygote.py)."""
    if threads_now() != 1:
        sock.sendall((json.dumps({"unsafe": f"{threads_now()} threads after the imports"}) + "\n").encode())
        return 1
    me = os.getpid()
    sock.sendall(b'{"ready": true}\n')
    children: set[int] = set()
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    pending = b""
    while True:
        for _ in selector.select(timeout=0.05):
            data = sock.recv(1 << 16)
            if not data:  # the launcher closed its end (or died): its run is over
                for pid in children:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                return 0
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    _child(request, sock, me)
                children.add(pid)
                sock.sendall((json.dumps({"started": pid}) + "\n").encode())
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            sock.sendall((json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n").encode())


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
