"""This process's peak resident set size.

getrusage's ru_maxrss survives execve(2): a process started by a large parent reports the parent's
peak until it outgrows it. /proc/self/status VmHWM belongs to the process's own address space, so
it starts afresh at exec. Used for the max_rss_bytes that servers and workers report.
"""
from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_bytes() -> int:
    """VmHWM from /proc/self/status (Linux); ru_maxrss where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
