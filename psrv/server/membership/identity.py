"""Which process works as each rank. A worker's PSClient makes a random session id and sends it
with every request: a second live process claiming the same rank is refused (RANK_IN_USE) and
never touches the first one's clocks; a restarted process (the old one silent past
worker_timeout, or gone with LEAVE) takes the rank over."""
from __future__ import annotations

import logging

from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError
from psrv.server.validate import HelloAgain

log = logging.getLogger("psrv.server")


class Sessions:
    """The session each rank is held by. A request without a session (0: a raw tool, not
    PSClient) is not checked; the first session heard for a rank (a fresh or restarted shard)
    holds it."""

    def __init__(self, *, shard: int, timeout: float):
        self.shard = shard
        self.timeout = timeout
        self._held: dict[int, int] = {}  # rank -> session

    def check(self, msg: Message, *, active: bool, silent: float) -> bool:
        """Let `msg` through, or raise: RANK_IN_USE while the rank's holder is alive (active and
        heard from within worker_timeout); HelloAgain for another request of a new process once
        the holder is gone, so it says HELLO and takes the rank over. True when `msg` is that HELLO:
        a new process took the rank over from another one."""
        w, sid = msg.worker, msg.session
        held = self._held.get(w)
        if not sid or held == sid:
            return False
        if held is None:
            self._held[w] = sid
            return False
        # a launcher that saw the holder's process die says so in the new process's HELLO (psrv run's worker
        # restarts): the rank is free at once, not after worker_timeout of silence
        dead = msg.type is MsgType.HELLO and msg.fields.get("predecessor_dead") is True
        alive = active and silent <= self.timeout and not dead
        if alive:  # the service logs the refusal as a warning
            raise ProtocolError(ErrorCode.RANK_IN_USE,
                                f"rank {w} is already in use by another live worker (heard {silent:.1f}s "
                                f"ago); give each worker its own --rank",
                                fields={"worker_timeout": self.timeout, "heard": silent})
        if msg.type is not MsgType.HELLO:
            raise HelloAgain(f"rank {w} is held by another (silent) process; send HELLO to take it over")
        why = "died, its launcher says" if dead else "was silent for %.1fs" % silent if active else "is gone"
        log.info("shard %d: a new process takes rank %d over (the previous one %s)", self.shard, w, why)
        self._held[w] = sid
        return True

    def state_dict(self) -> dict:
        return {int(w): int(sid) for w, sid in self._held.items()}

    def load_state_dict(self, state: dict) -> None:
        """Who holds each rank, as a backup takes it from its primary's state."""
        self._held = {int(w): int(sid) for w, sid in state.items()}
