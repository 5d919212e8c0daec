"""Pushes dropped as late for a clock the worker had already pushed: a loop that does not push
with the clock of its last reply. Counted per worker; after WARN_AFTER in a row the shard warns
and the reply says so, so the client warns too (a straggler's late drops with backup workers,
which push the clock they were given, are by design and not counted here)."""
from __future__ import annotations

import logging

log = logging.getLogger("psrv.server")


class LateStreaks:
    WARN_AFTER = 3

    def __init__(self, *, shard: int):
        self.shard = shard
        self._streak: dict[int, int] = {}  # worker -> consecutive stale pushes dropped

    def dropped(self, worker: int, *, clock: int, pushed: int, open_clock: int) -> dict:
        """A push of `clock` was dropped as late; `pushed` is the clock the worker had reached
        before it. Returns the reply's extra fields: {"late": {streak, clock, open}} when stale."""
        if clock >= pushed:  # a clock it had not pushed yet: a straggler, not a stale loop
            self._streak.pop(worker, None)
            return {}
        n = self._streak[worker] = self._streak.get(worker, 0) + 1
        if n == self.WARN_AFTER:
            log.warning("shard %d: dropped %d pushes of worker %d in a row as late: it pushes clock %d, "
                        "the shard is at clock %d (its loop does not push with the clock from its last reply)",
                        self.shard, n, worker, clock, open_clock)
        return {"late": {"streak": n, "clock": clock, "open": open_clock}}

    def applied(self, worker: int) -> None:
        """A push of `worker` was taken: its streak ends."""
        self._streak.pop(worker, None)
