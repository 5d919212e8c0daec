"""Process-wide settings, applied only by psrv's own entry points (`psrv serve`, `psrv worker`, `psrv run`).

The library -- importing psrv, constructing a PSClient, calling psrv.serve -- never changes its host
process: the allocator and the signal handlers belong to whoever owns main(). An entry point calls
`tune_malloc()` first thing (before any zmq context starts its I/O thread); to serve, it hands
`stop_on_signals()` the running shard's stop so that SIGTERM ends it cleanly; to train or launch,
`interrupt_on_signals()` makes SIGTERM raise as Ctrl-C does (`Interrupted`, exit code 128 + signal);
`use_threads()` gives torch this process's share of the host's cores (the rule `psrv run` applies too);
`freeze_imports()`, once its imports are done, keeps what they made out of the garbage collector's walks.
"""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import shlex
import signal
import time
from pathlib import Path
from typing import Callable, Iterable

log = logging.getLogger("psrv.process")
ROLES = ("serve", "worker")  # the psrv commands that run torch and share a host's cores

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h


def tune_malloc() -> bool:
    """Have glibc keep freed big buffers for reuse instead of unmapping them; True if applied.

    zmq receives every large message into a fresh malloc'd buffer. By default glibc maps each one
    (and its zmq I/O thread's own arena maps them too), so every page of every message faults in
    and is zeroed afresh: 16k page faults and about a third of the CPU of a 64 MB round trip here.
    One arena and no mmap/trim thresholds in reach make a freed buffer the next message's buffer.
    Call it before the first zmq socket (the I/O thread's arena is made then). Process-wide and
    idempotent; a no-op (False) without glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    for option, value in ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 1 << 30)):
        mallopt(option, value)
    return True


def freeze_imports() -> int:
    """Keep every object alive now out of the garbage collector's passes (gc.freeze); call it once the
    process's imports are done. torch's and psrv's imports leave about 170k objects that every full
    collection walks (0.09 s each here); the end of a process that froze them took 0.12 s instead of 0.5 s,
    and in a child forked from psrv's fork server, whose walk copies every page it touches, 0.2 s instead
    of 1.4 s. Objects made later are collected as before. Returns how many objects were frozen."""
    gc.freeze()
    return gc.get_freeze_count()


def stop_on_signals(stop: Callable[[], None],
                    signums: Iterable[signal.Signals] = (signal.SIGTERM,)) -> Callable[[], None]:
    """Call `stop()` when one of `signums` arrives, e.g. a psrv.server.run.Server's `stop`: the shard
    then leaves its loop and writes its final checkpoint. Main thread only (Python's rule for
    signal handlers). Returns a function that puts the previous handlers back."""
    previous = {s: signal.signal(s, lambda *_: stop()) for s in signums}

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return restore


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, raised in the main thread by the handler `interrupt_on_signals` installs;
    `signum` says which. A KeyboardInterrupt, so code that handles Ctrl-C handles SIGTERM alike."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def exit_code(exc: BaseException) -> int:
    """The shell's code for a process a signal stopped: 128 + the signal's number (SIGINT 130,
    SIGTERM 143); a plain KeyboardInterrupt is SIGINT's."""
    return 128 + (exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT))


def interrupt_on_signals(signums: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM), *,
                         grace: float = 10.0) -> Callable[[], None]:
    """Raise `Interrupted` in the main thread when one of `signums` arrives, so that SIGTERM takes
    the path Ctrl-C takes (a worker leaves its shards and writes what it did).

    Only the first signal raises: more within `grace` seconds (a second Ctrl-C, the launcher's
    SIGTERM after its SIGINT) are ignored, so they cannot cut the bounded clean-up short; after
    that they raise again. Main thread only. Returns a function that puts the previous handlers back."""
    first: list[float] = []

    def handler(signum, _frame) -> None:
        now = time.monotonic()
        if first and now - first[0] < grace:
            return
        first[:] = [now]
        raise Interrupted(signum)
    previous = {s: signal.signal(s, handler) for s in signums}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)
    return restore


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: taskset, a cgroup's cpuset, SLURM's binding)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cores_each(processes: int) -> int:
    """Each of `processes` sharing this host's cores gets an even share, at least one: the rule `psrv run`
    gives its processes (experiments/launcher/cluster.py thread_env) and `use_threads` a process started by hand.
    Oversubscribed, torch's threads wait for a descheduled peer at every parallel op."""
    return max(1, usable_cores() // max(1, processes))


def _is_psrv_process(argv: list[str]) -> bool:
    """`psrv serve|worker ...`, `python [OPTIONS] .../psrv serve|worker ...` or `python [OPTIONS] -m psrv.cli
    serve|worker ...`; not a wrapper that names one in its arguments (srun, timeout, sudo)."""
    for i, token in enumerate(argv[:-1]):
        name = os.path.basename(token)
        if name == "psrv" or name == "psrv.cli" and i > 0 and argv[i - 1] == "-m":
            before = argv[:i - 1] if name == "psrv.cli" else argv[:i]
            return argv[i + 1] in ROLES and all(t.startswith("-") or os.path.basename(t).startswith("python")
                                                 for t in before)
    return False


def psrv_processes_here(proc: Path = Path("/proc")) -> int:
    """How many `psrv serve` and `psrv worker` processes run on this host now, this one counted (read from
    /proc, whatever network namespace each is in: they share the cores); 1 where /proc is not there."""
    count, own = 1, str(os.getpid())
    for entry in proc.glob("[0-9]*"):
        if entry.name == own:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        argv = [a for a in argv if a]
        if len(argv) == 1 and " " in argv[0]:  # a title set in one piece: psrv run's forked processes (setproctitle)
            try:
                argv = shlex.split(argv[0])
            except ValueError:
                pass
        count += _is_psrv_process(argv)
    return count


def thread_count(threads: int) -> tuple[int, str]:
    """(torch threads, why) for a process whose threads setting is `threads`: itself where given (> 0),
    else OMP_NUM_THREADS where set (psrv run sets it for each process it starts), else this host's cores
    divided among the psrv serve/worker processes running on it now (this one included)."""
    if threads > 0:
        return threads, "--threads"
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given), "OMP_NUM_THREADS"
    processes = psrv_processes_here()
    return cores_each(processes), f"{usable_cores()} cores / {processes} psrv processes on this host"


def use_threads(threads: int, *, say: bool = True) -> tuple[int, str]:
    """Set torch's intra-op threads by `thread_count(threads)`, say so in the log (`say`; else the caller
    does, e.g. once a shard's port is bound, so a refused --bind stays one line), and return (the count
    torch now has, why). Process-wide: psrv serve and psrv worker call it, never the library."""
    import torch
    count, why = thread_count(threads)
    torch.set_num_threads(count)
    count = torch.get_num_threads()
    if say:
        log.info("torch threads %d (%s)", count, why)
    return count, why
