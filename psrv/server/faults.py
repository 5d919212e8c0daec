"""Faults a nemesis injects into a shard from outside (docs/reliability.md, "The nemesis"): a late ack, a
backup's loop stalled while a forwarded op waits for its acknowledgement. The nemesis writes a JSON file,
{"id": N, "late_ack_s": SECONDS}; the shard looks at it at most every POLL seconds and obeys each new id
once. `psrv serve` gives its shard the file PSRV_FAULTS/PID.json when that environment variable is set."""
from __future__ import annotations

import json
import time
from pathlib import Path

POLL = 0.05


class InjectedFaults:
    def __init__(self, path: Path):
        self.path = path
        self._seen: set = set()
        self._looked = -float("inf")
        self._mtime = None

    def late_ack(self) -> float:
        """Seconds to hold the next acknowledgement back: a new late_ack fault's, once; else 0."""
        now = time.monotonic()
        if now - self._looked < POLL:
            return 0.0
        self._looked = now
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return 0.0
        if mtime == self._mtime:
            return 0.0
        self._mtime = mtime
        try:
            fault = json.loads(self.path.read_text())
        except ValueError:  # being written: the next look reads it whole
            self._mtime = None
            return 0.0
        if fault.get("id") in self._seen:
            return 0.0
        self._seen.add(fault.get("id"))
        return max(0.0, float(fault.get("late_ack_s", 0.0)))
