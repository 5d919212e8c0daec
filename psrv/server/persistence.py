"""A shard's state as one dict and its checkpoints: what ShardService (psrv/server/service.py) carries on
from. state_dict and load_state_dict compose and rebuild its parts (psrv/server/snapshot.py); a periodic
checkpoint is copied on the loop and written by a thread (psrv/server/checkpointing.py), the final one
waited for; so is one a CHECKPOINT request asks for (AdminCheckpoints), answered when its write is done.
A mixin of ShardService, whose attributes it reads: cfg, shard, plan_hash, plans, controller,
dedup, liveness, fragments, transport, stats, writer, now, resumed_from, stopped, admin_checkpoints, and its
`_reply` and `_refuse`."""
from __future__ import annotations

import logging

from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError
from psrv.server import snapshot
from psrv.server.liveness import Liveness

log = logging.getLogger("psrv.server")


class ShardPersistence:
    def state_dict(self) -> dict:
        """Everything this shard needs to carry on, as plain data (keys: psrv/server/snapshot.py)."""
        if self.shard is None:
            raise ValueError("a shard has no state before its first HELLO (which brings its size)")
        return snapshot.compose(self.cfg, snapshot.Parts(self.plan_hash, self.shard, self.controller,
                                                         self.dedup, self.liveness, self.fragments))

    def load_state_dict(self, state: dict, *, source: str = "state dict") -> None:
        """Carry on from `state` (a state_dict of this job's shard): every part is built and checked
        first, then swapped in at once; CheckpointError, with nothing changed, if it does not fit."""
        fresh = Liveness(timeout=self.liveness.timeout, join_timeout=self.liveness.join_timeout, now=self.now)
        parts = snapshot.build(state, self.cfg, liveness=fresh, source=source)
        self.plan_hash, self.shard, self.controller, self.dedup, self.liveness, self.fragments = parts
        self.plans.resumed(self.plan_hash)
        self.shard.param.data = self.transport.share(self.shard.param.data)
        self.resumed_from = self.shard.version
        active = self.controller.active
        self.stats.membership(active, {w: self.controller.clocks.get(w, 0) for w in active})
        log.info("shard %d: resumed from %s at version %d (active workers %s)", self.cfg.shard, source,
                 self.shard.version, sorted(active))

    def save_checkpoint(self) -> str | None:
        """Write this shard's checkpoint and return once it is on disk (after any write in flight); None
        when it has no weights yet (no INIT) or the write failed."""
        if self.shard is None or not self.shard.initialised:
            return None
        return self.writer.save_now(self.state_dict(), version=self.shard.version)

    def start_checkpoint(self) -> bool:
        """Copy this shard's state now and write it from a thread while requests are answered; False
        when nothing was started: no weights yet (no INIT), or a write is still in flight."""
        if self.shard is None or not self.shard.initialised:
            return False
        return self.writer.start(self.state_dict(), version=self.shard.version)

    def answer_admin_checkpoints(self, *, at_exit: bool = False, final: str | None = None) -> None:
        """Move the CHECKPOINT requests on, from the shard's loop: answer those whose write is done, and start
        the write the others wait for once none is in flight. `at_exit`: the loop has ended and written its
        final checkpoint (`final`, its path, None if it failed), which answers every request still waiting."""
        waiting, writer = self.admin_checkpoints, self.writer
        if waiting.writing and not writer.writing:
            self._answer_checkpoints(waiting.writing, writer.result, waiting.version)
            waiting.writing = []
        if at_exit:
            self._answer_checkpoints(waiting.asked, final, self.shard.version)
            waiting.asked = []
        elif waiting.asked and not writer.writing:
            waiting.version = self.shard.version
            self.start_checkpoint()
            waiting.writing, waiting.asked = waiting.asked, []

    def _answer_checkpoints(self, requests: list[tuple], path: str | None, version: int) -> None:
        for peer, seq in requests:
            if path is None:
                self._refuse(peer, seq, ProtocolError(ErrorCode.INTERNAL, "checkpoint failed; see the server's log"))
            else:
                self._reply(peer, Message(MsgType.OK, seq=seq, fields={"path": path, "version": version}))


class AdminCheckpoints:
    """CHECKPOINT requests (psrv admin checkpoint) waiting for their write: `asked`, for a write not started
    yet (one in flight was taken before they asked, so it cannot answer them), and `writing`, for the one in
    flight. Each is answered with the write's path, or an INTERNAL error if it failed."""

    def __init__(self):
        self.asked: list[tuple] = []  # (peer, seq)
        self.writing: list[tuple] = []
        self.version = 0  # the version the write in flight holds

    def __bool__(self) -> bool:
        return bool(self.asked or self.writing)
