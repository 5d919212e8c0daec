"""What a worker says while shards have not answered its HELLO: one WARNING line (logger psrv.worker)
every few seconds naming each silent shard and its address, the wait so far and the bound, so a
worker whose servers are down or not up yet is not silent until its timeout.

`option` names how the caller sets that bound, as the timeout's own error does: `timeout=` for
psrv.Worker and PSClient (the library), `--request-timeout` for `psrv worker` (the command line)."""
from __future__ import annotations

import logging
from typing import Sequence

log = logging.getLogger("psrv.worker")

NOTICE_EVERY = 5.0  # seconds between two lines; a third of a shorter bound, so one still shows
LIBRARY_OPTION = "timeout="  # psrv.Worker's and PSClient's keyword for the bound


def notice_interval(timeout: float) -> float:
    """Seconds between two lines for a wait bounded by `timeout` seconds: 5, or a third of a shorter bound."""
    return min(NOTICE_EVERY, max(0.5, timeout / 3))


class HelloWait:
    """The lines of one HELLO round trip begun at `started` (time.monotonic): `due` is when the next
    line is; `say(now, silent)` writes it for the shards in `silent` and sets the one after."""

    def __init__(self, *, worker: int, servers: Sequence[str], timeout: float, option: str, started: float):
        self.worker, self.servers, self.timeout, self.option = worker, list(servers), timeout, option
        self.started, self.every = started, notice_interval(timeout)
        self.due = started + self.every

    def say(self, now: float, silent: Sequence[int]) -> None:
        where = ", ".join(f"{self.servers[s]} (shard {s})" for s in silent)
        log.warning("worker %d: no answer to HELLO yet from %s after %.0fs; giving up at %gs without one "
                    "(%s sets the bound); is `psrv serve` running there?", self.worker, where,
                    now - self.started, self.timeout, self.option)
        self.due = now + self.every
