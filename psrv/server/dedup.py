"""Exactly-once pushes: the last push seq each worker had accepted and the answer it got.

Clients re-send an unanswered request with the SAME seq; a PUSH whose (worker, seq) was
already accepted is answered from this table and never applied twice. A push refused as non-finite
is recorded too (its info holds `refused`), so a re-send gets the same ERROR and is not counted again.
"""
from __future__ import annotations

from psrv.protocol import ErrorCode, ProtocolError


class Dedup:
    def __init__(self) -> None:
        self._last: dict[int, tuple[int, dict]] = {}  # worker -> (seq, reply fields)
        self._seen: dict[int, int] = {}               # worker -> highest request seq seen

    def note(self, worker: int, seq: int) -> None:
        if seq > self._seen.get(worker, 0):
            self._seen[worker] = seq

    def last_seq(self, worker: int) -> int:
        """The highest seq this worker used: a restarted worker continues above it."""
        return max(self._last.get(worker, (0, {}))[0], self._seen.get(worker, 0))

    def replay(self, worker: int, seq: int, version: int) -> dict | None:
        """The answer for an already accepted push, or None for a new one (seq > last)."""
        last, info = self._last.get(worker, (0, {}))
        if seq > last:
            return None
        if seq == last and info:
            return {**info, "duplicate": True}
        return {"version": version, "duplicate": True, "staleness": 0}

    def record(self, worker: int, seq: int, info: dict) -> None:
        self._last[worker] = (seq, dict(info))

    def state_dict(self) -> dict:
        return {"last": {int(w): {"seq": s, "info": i} for w, (s, i) in self._last.items()},
                "seen": dict(self._seen)}

    def load_state_dict(self, state: dict) -> None:
        self._last = {int(w): (int(v["seq"]), dict(v["info"])) for w, v in state["last"].items()}
        self._seen = {int(w): int(s) for w, s in state["seen"].items()}


def refused_again(info: dict) -> dict:
    """A replayed answer: the info itself, or the same NONFINITE refusal raised again."""
    if "refused" in info:
        raise ProtocolError(ErrorCode.NONFINITE, info["refused"])
    return info
