"""What a shard says about workers it has never heard from: one line once it has waited a few seconds
for them, and one WARNING when it gives up on them after `join_timeout` (--join-timeout), so a rank
that never starts (killed while importing torch, a launch that failed) is named, with the bound,
instead of holding a sync barrier in silence."""
from __future__ import annotations

import logging
from typing import Iterable

from psrv.server.liveness import Liveness

log = logging.getLogger("psrv.server")

NOTICE_AFTER = 5.0  # seconds before the first line; half of a shorter join_timeout, so it still shows


def _ranks(workers: Iterable[int]) -> str:
    workers = list(workers)
    return ("worker " if len(workers) == 1 else "workers ") + ", ".join(map(str, workers))


class JoinWatch:
    """The lines of shard `shard` about joining. `look` is called every turn of the loop, `gave_up`
    with the workers the liveness check just removed without ever having heard from them."""

    def __init__(self, *, shard: int):
        self.shard = shard
        self._noticed = False

    def look(self, liveness: Liveness, active: Iterable[int]) -> None:
        """Once, after a few seconds: the active workers not joined yet, and the bound. A WARNING when
        others have joined (they may be held for these), INFO while no worker has (the shard is up first)."""
        if self._noticed or liveness.waited() < min(NOTICE_AFTER, liveness.join_timeout / 2):
            return
        self._noticed = True
        active = set(active)
        unheard = liveness.unheard(active)
        if unheard:
            level = logging.WARNING if len(unheard) < len(active) else logging.INFO
            log.log(level, "shard %d: %s not joined yet (no HELLO after %.1fs); going on without them at %gs "
                    "(--join-timeout)", self.shard, _ranks(unheard), liveness.waited(), liveness.join_timeout)

    def gave_up(self, workers: list[int], liveness: Liveness, *, others: bool) -> None:
        """`workers` never joined within join_timeout and left the active set; `others`: whether any
        worker is still active (else the shard ends)."""
        then = "going on without them; a HELLO later brings them back" if others else "no worker left, the shard ends"
        log.warning("shard %d: %s never joined (no HELLO within --join-timeout %gs); %s", self.shard,
                    _ranks(workers), liveness.join_timeout, then)
