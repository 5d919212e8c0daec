"""A shard's state as one dict, and its checkpoints: state_dict and load_state_dict compose and rebuild the
parts of the shard's state a checkpoint holds (snapshot.py); a periodic checkpoint is copied on the loop and
written by a thread (writer.py), the final one waited for; so is one a CHECKPOINT request asks for
(AdminCheckpoints), answered when its write is done."""
from __future__ import annotations

import logging

from psrv.checkpoint import Checkpointer
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError
from psrv.server.checkpoints import snapshot
from psrv.server.checkpoints.writer import BackgroundCheckpoints
from psrv.server.liveness import Liveness
from psrv.server.state import ShardState

log = logging.getLogger("psrv.server")


class Checkpoints:
    """`service`: the ShardService (psrv/server/service.py) whose `reply`, `refuse` and `membership` (the
    plans, told of a resumed plan) it uses."""

    def __init__(self, state: ShardState, service):
        self.state = state
        self.service = service
        cfg = state.cfg
        self.checkpointer = Checkpointer(cfg.checkpoint_dir, shard=cfg.shard, num_shards=cfg.num_shards,
                                         every=cfg.checkpoint_every, now=state.now)
        self.writer = BackgroundCheckpoints(self.checkpointer)  # periodic checkpoints, off the loop
        self.admin = AdminCheckpoints()  # CHECKPOINT requests waiting for their write

    def resume(self) -> None:
        """With --resume and a --checkpoint-dir: carry on from the checkpoint there, if there is one."""
        saved = self.checkpointer.load()
        if saved is not None:
            self.load_state_dict(saved, source=str(self.checkpointer.path))

    def state_dict(self) -> dict:
        """Everything this shard needs to carry on, as plain data (keys: psrv/server/checkpoints/snapshot.py)."""
        s = self.state
        if s.shard is None:
            raise ValueError("a shard has no state before its first HELLO (which brings its size)")
        return snapshot.compose(s.cfg, snapshot.Parts(s.plan_hash, s.shard, s.controller, s.dedup, s.liveness,
                                                      s.fragments))

    def load_state_dict(self, state: dict, *, source: str = "state dict", finishing=()) -> None:
        """Carry on from `state` (a state_dict of this job's shard): every part is built and checked
        first, then swapped in at once, and the pushes in flight on the state replaced are forgotten
        (Pushes.forget_in_flight); CheckpointError, with nothing changed, if it does not fit. `finishing`: the
        workers that sent their final pull, which a checkpoint leaves out and a primary's state holds
        (psrv/server/replication/handler.py): counted out before the loaded merges are looked at."""
        s = self.state
        fresh = Liveness(timeout=s.liveness.timeout, join_timeout=s.liveness.join_timeout, now=s.now)
        parts = snapshot.build(state, s.cfg, liveness=fresh, source=source)
        s.plan_hash, s.shard, s.controller, s.dedup, s.liveness, s.fragments = parts
        self.service.pushes.forget_in_flight()
        self.service.membership.plans.resumed(s.plan_hash)
        s.shard.param.data = s.transport.share(s.shard.param.data)
        s.resumed_from = s.shard.version
        for worker in finishing:  # as the primary's finish did (a quorum's counts move with it)
            s.controller.finish(int(worker))
        active = s.controller.active
        s.stats.membership(active, {w: s.controller.clocks.get(w, 0) for w in active})
        log.info("shard %d: resumed from %s at version %d (active workers %s)", s.cfg.shard, source,
                 s.shard.version, sorted(active))
        self.service.pushes.reloaded()  # after the line above: a merge it commits is logged after the resume

    def save(self) -> str | None:
        """Write this shard's checkpoint and return once it is on disk (after any write in flight); None
        when it has no weights yet (no INIT) or the write failed."""
        shard = self.state.shard
        if shard is None or not shard.initialised:
            return None
        return self.writer.save_now(self.state_dict(), version=shard.version)

    def start(self) -> bool:
        """Copy this shard's state now and write it from a thread while requests are answered; False
        when nothing was started: no weights yet (no INIT), or a write is still in flight."""
        shard = self.state.shard
        if shard is None or not shard.initialised:
            return False
        return self.writer.start(self.state_dict(), version=shard.version)

    def tick(self) -> None:
        """Each turn of a primary's loop: move the CHECKPOINT requests on, and start a periodic checkpoint
        when one is due and none is being written."""
        if self.admin:
            self.answer_admin()
        if self.checkpointer.due() and not self.writer.writing:
            self.start()

    def on_checkpoint(self, peer, msg: Message) -> None:
        shard = self.state.shard
        if not self.state.cfg.checkpoint_dir:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, "this server has no --checkpoint-dir")
        if shard is None or not shard.initialised:  # nothing to write yet: said at once
            self.service.reply(peer, Message(MsgType.OK, seq=msg.seq, fields={"path": None, "version": 0}))
            return
        self.admin.asked.append((peer, msg.seq))  # written off the loop, answered when done
        self.answer_admin()

    def answer_admin(self, *, at_exit: bool = False, final: str | None = None) -> None:
        """Move the CHECKPOINT requests on, from the shard's loop: answer those whose write is done, and start
        the write the others wait for once none is in flight. `at_exit`: the loop has ended and written its
        final checkpoint (`final`, its path, None if it failed), which answers every request still waiting."""
        waiting, writer = self.admin, self.writer
        if waiting.writing and not writer.writing:
            self._answer(waiting.writing, writer.result, waiting.version)
            waiting.writing = []
        if at_exit:
            self._answer(waiting.asked, final, self.state.shard.version)
            waiting.asked = []
        elif waiting.asked and not writer.writing:
            waiting.version = self.state.shard.version
            self.start()
            waiting.writing, waiting.asked = waiting.asked, []

    def _answer(self, requests: list[tuple], path: str | None, version: int) -> None:
        for peer, seq in requests:
            if path is None:
                self.service.refuse(peer, seq, ProtocolError(ErrorCode.INTERNAL,
                                                             "checkpoint failed; see the server's log"))
            else:
                self.service.reply(peer, Message(MsgType.OK, seq=seq, fields={"path": path, "version": version}))

    def summary(self) -> dict:
        c = self.checkpointer
        return {"checkpoints": c.count, "checkpoint_version": c.version, "checkpoint_seconds": c.seconds,
                "checkpoint_max_age_seconds": c.max_age, "checkpoint_writing": self.writer.writing}


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
