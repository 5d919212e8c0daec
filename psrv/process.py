"""Process-wide settings, applied only by psrv's own entry points (`psrv serve`, `psrv worker`, `psrv run`).

The library -- importing psrv, constructing a PSClient, calling psrv.serve -- never changes its host
process: the allocator and the signal handlers belong to whoever owns main(). An entry point calls
`tune_malloc()` first thing (before any zmq context starts its I/O thread); to serve, it hands
`stop_on_signals()` the running shard's stop so that SIGTERM ends it cleanly; to train or launch,
`interrupt_on_signals()` makes SIGTERM raise as Ctrl-C does (`Interrupted`, exit code 128 + signal).
"""
from __future__ import annotations

import ctypes
import signal
import time
from typing import Callable, Iterable

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
