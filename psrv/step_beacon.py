"""A rank's step beacon: a small file the rank keeps mapped in memory, saying how many steps it has made,
its slowest step, what it is doing now and the last collective it entered; the launcher reads it to find a
rank that hangs (experiments/launcher/stall.py).

Why a mapped file: the rank must say what it is in *before* it blocks in a collective, because a rank
stopped or deadlocked there writes nothing more. A write into the mapping is a copy of 128 bytes, with no
system call, so marking two or three phases a step costs about a microsecond; the reader sees it at once
through the page cache (both processes on one host; a file on a network filesystem would not do).

A read may race a write and see a mix of two records; the watch acts only on a rank whose record has not
changed for seconds, which no write is then tearing. No torch here: the launcher imports this.
"""
from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import NamedTuple

WORKING, WAITING, OFF_CLOCK = 0, 1, 2  # a phase's kind: computing, in a collective, off the clock
_LAYOUT = struct.Struct("<qqdB47s56s")  # pid, steps done, slowest step (s), kind, phase, last collective
SIZE = _LAYOUT.size  # 128 bytes


class Beacon(NamedTuple):
    """What a rank's beacon said when read. `kind`: WORKING (forward, backward, a script's own code),
    WAITING (in the collective `phase`) or OFF_CLOCK (an evaluation or the final record: working, not a
    step, while the other ranks wait for it)."""
    pid: int
    steps: int
    slowest: float
    kind: int
    phase: str
    collective: str


class StepBeacon:
    """The writer, one per rank. `path` None: a beacon that writes nothing (a worker outside `psrv run`)."""

    def __init__(self, path: Path | None):
        self.path, self._map, self.pid = path, None, os.getpid()
        self.steps, self.slowest = 0, 0.0
        self.kind, self.phase, self.collective = WORKING, b"start-up", b""
        self._encoded: dict[str, bytes] = {}
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, self._packed())  # whole before it is mapped: a reader never sees a short file grow
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)

    def working(self, phase: str) -> None:
        """The rank computes (`phase`: what, e.g. 'forward and backward')."""
        self._mark(WORKING, phase)

    def waiting(self, collective: str) -> None:
        """The rank enters `collective` (e.g. 'all_reduce of the gradients (DDP)'), where it waits for the others."""
        self.collective = self._bytes(collective)
        self._mark(WAITING, collective)

    def off_clock(self, phase: str) -> None:
        """The rank works off the clock (`phase`: an evaluation, writing the record): the others wait for it."""
        self._mark(OFF_CLOCK, phase)

    def stepped(self, seconds: float) -> None:
        """A step ended; it took `seconds`."""
        self.steps += 1
        self.slowest = max(self.slowest, seconds)
        self._write()

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def _mark(self, kind: int, phase: str) -> None:
        self.kind, self.phase = kind, self._bytes(phase)
        self._write()

    def _bytes(self, text: str) -> bytes:
        encoded = self._encoded.get(text)
        if encoded is None:
            encoded = self._encoded[text] = text.encode("utf-8")  # struct cuts it to its field
        return encoded

    def _packed(self) -> bytes:
        return _LAYOUT.pack(self.pid, self.steps, self.slowest, self.kind, self.phase, self.collective)

    def _write(self) -> None:
        if self._map is not None:
            _LAYOUT.pack_into(self._map, 0, self.pid, self.steps, self.slowest, self.kind, self.phase,
                              self.collective)


def read_beacon(path: Path) -> Beacon | None:
    """The beacon at `path`, or None where there is none yet (or it is not one)."""
    try:
        with open(path, "rb") as f:
            data = f.read(SIZE)
    except OSError:
        return None
    if len(data) != SIZE:
        return None
    pid, steps, slowest, kind, phase, collective = _LAYOUT.unpack(data)
    return Beacon(pid, steps, slowest, kind, _text(phase), _text(collective))


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", errors="replace")
