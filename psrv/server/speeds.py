"""Each worker's seconds per inner step, as its pushes report them (`step_seconds`, sent only under
local_steps 'auto:H'), and the fastest of the active workers', which every push reply carries back as
`fastest_step_seconds`: the worker plans its next round's inner steps from it (psrv/local_period.py)."""
from __future__ import annotations

import math

from psrv.protocol import ErrorCode, ProtocolError


class WorkerSpeeds:
    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}

    def report(self, worker: int, fields: dict) -> None:
        """Record a push's `step_seconds`, if it has one; ProtocolError for a value that is not a
        positive finite number (checked before the push is applied, so a bad one changes nothing)."""
        value = fields.get("step_seconds")
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ProtocolError(ErrorCode.MALFORMED, f"step_seconds must be a positive number; got {value!r}")
        self.seconds[worker] = float(value)

    def fastest(self, active) -> dict:
        """{'fastest_step_seconds': the smallest of the active workers'}, or {} when none reported."""
        known = [s for w, s in self.seconds.items() if w in active]
        return {"fastest_step_seconds": min(known)} if known else {}

    def forget(self, worker: int) -> None:
        self.seconds.pop(worker, None)
