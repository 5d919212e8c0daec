"""The replication faults of the conformance failure cases (tests/conformance/test_replica_faults.py), beside
failures.py's kill: a primary paused at a chosen push that then goes on (PausePrimary), a backup whose
acknowledgement of a chosen push comes late (LateAck), a killed primary with two backups (KillWithTwoBackups), a
backup asking to join in the middle of a chunked push or of a sync barrier (JoinMidPush); each records what it saw, and where a case
needs the rest of the run to stream to a replica that came back, the workers wait at a chosen step until it
follows (_Until)."""
from __future__ import annotations

import dataclasses
import time

from psrv.config import RunConfig
from psrv.server.replication import stream
from psrv.server.run import Server
from psrv.server.replication.witness import Witness
from tests.conformance.cluster import TIMEOUT
from tests.conformance.failures import AtStep, KillPrimary, Watch


class PausePrimary(KillPrimary):
    """Shard `shard`'s first primary stops for `seconds` at its `push`-th push (as failures.py KillPrimary picks it), as a
    SIGSTOP'd or starved process does, then goes on where it stopped: before handling that message, or with
    `unanswered` after handling it (its backups hold it) and before its replies leave. Past the takeover bound
    its backup claims the shard; the primary, back, hears an older epoch's "fenced" (or loses its next claim on
    the witness) and stops without acknowledging anything more. With `back_at`, the workers wait at the start of
    that step until it is back and fenced, so that it comes back to a shard its backup still serves (without, the
    run may end first, and the witness's last word fences it). `resumed`: whether it went on after the pause;
    `fenced_at`: the epoch it was fenced at."""

    def __init__(self, cfg: RunConfig, *, push: int, seconds: float, shard: int = 0, chunk: int = 0,
                 unanswered: bool = False, back_at: int | None = None):
        super().__init__(push=push, shard=shard, chunk=chunk, unanswered=unanswered)
        self.seconds, self.resumed = seconds, False
        self.until = None if back_at is None else _Until(
            cfg, back_at, lambda: self.resumed and self.primary.service.replication.replicas.fenced,
            "the paused primary never came back fenced")

    def step(self, rank: int, step: int) -> None:
        if self.until is not None:
            self.until.step(rank, step)

    def started(self, servers: list[Server], backups: list[Server], witness: str) -> None:
        Watch.started(self, servers, backups, witness)
        self.primary = servers[self.shard]
        service = self.primary.service
        handle, sent = service.handle, service.sent

        def pausing(peer, frames: list) -> None:  # the primary's loop thread
            msg = self._due(frames) if self.death is None else None
            if msg is None:
                handle(peer, frames)
                return
            self.death = self._record(service, msg)
            if not self.unanswered:
                self._pause()
                handle(peer, frames)
                return
            held = []
            service.sent = lambda *args: held.append(args)  # the replies made while handling it wait for the pause
            try:
                handle(peer, frames)
            finally:
                service.sent = sent
            self._pause()
            for args in held:
                sent(*args)
        service.handle = pausing

    def _pause(self) -> None:
        time.sleep(self.seconds)
        self.resumed = True

    def finished(self) -> None:
        """The workers are done: a fenced primary's linger (5F, answering NOT_PRIMARY for workers that knew of no
        other replica; these knew its backup) is cut short, as Server.stop cuts it, once it is back and fenced."""
        replicas = self.primary.service.replication.replicas
        deadline = time.monotonic() + TIMEOUT
        while self.death is not None and not (self.resumed and replicas.fenced) and time.monotonic() < deadline:
            time.sleep(0.01)
        if replicas.fenced:
            self.primary.stop()

    @property
    def fenced_at(self) -> int | None:
        replicas = self.primary.service.replication.replicas
        return replicas.config.epoch if replicas.fenced and replicas.config is not None else None


class _LateOnce:
    """psrv/server/faults.py's InjectedFaults as a backup reads it: `late_ack()` says `seconds` once armed, then 0."""

    def __init__(self, seconds: float):
        self.seconds, self.armed, self.fired = seconds, False, False

    def late_ack(self) -> float:
        if not self.armed or self.fired:
            return 0.0
        self.fired = True
        return self.seconds


class _Until(AtStep):
    """At the start of step `at` (AtStep: nothing in flight), the workers wait until `ready()` holds (TIMEOUT)."""

    def __init__(self, cfg: RunConfig, at: int, ready, what: str):
        super().__init__(cfg, at)
        self.ready, self.what = ready, what

    def fire(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not self.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"at step {self.at}: {self.what}")
            time.sleep(0.01)


def _follows(backup: Server, primary: Server) -> bool:
    """Whether `backup` follows `primary`'s stream and `primary` counts it among its backups."""
    follower = backup.service.replication.follower
    return (follower is not None and follower.following
            and backup.address in primary.service.replication.replicas.addresses[1:])


class LateAck(KillPrimary):
    """Shard `shard`'s first backup holds back its acknowledgement of the op that forwards its primary's
    `push`-th push (its chunk `chunk`) for `seconds` (the nemesis's late_ack: the backup's loop stalls before it
    acknowledges), past the primary's ack timeout: the primary drops it at a new epoch and goes on alone; the
    backup, back, finds the epoch moved, joins again and is sent the state. The workers wait at the start of step
    `at` until it follows again, so that the rest of the run streams to it. `fault`: whether it fired."""

    def __init__(self, cfg: RunConfig, *, push: int, seconds: float, at: int, shard: int = 0, chunk: int = 0):
        super().__init__(push=push, shard=shard, chunk=chunk)
        self.fault = _LateOnce(seconds)
        self._given = False  # whether a backup was started with the fault (faults)
        self.until = _Until(cfg, at, lambda: self.fault.fired and self.replicas.admitted >= 2
                            and _follows(self.backup, self.primary), "the backup never joined its primary again")

    def faults(self, config):
        """The late ack, given at its start to the first backup of the shard started (as `psrv serve` gives a
        nemesis's faults), that `started` then watches."""
        if config.backup_of and config.shard == self.shard and not self._given:
            self._given = True
            return self.fault
        return None

    def started(self, servers: list[Server], backups: list[Server], witness: str) -> None:
        Watch.started(self, servers, backups, witness)
        self.primary = servers[self.shard]
        self.replicas = self.primary.service.replication.replicas
        self.backup = next(b for b in backups if b.cfg.shard == self.shard)
        assert self.backup.service.replication.faults is self.fault, "the late ack went to another replica"
        service = self.primary.service
        handle = service.handle

        def arming(peer, frames: list) -> None:  # the primary's loop thread: the next op it forwards is this one
            msg = self._due(frames) if self.death is None else None
            if msg is not None:
                self.death = self._record(service, msg)
                self.fault.armed = True
            handle(peer, frames)
        service.handle = arming

    def step(self, rank: int, step: int) -> None:
        self.until.step(rank, step)

    def finished(self) -> None:
        """The shard's configurations as its witness holds them at the end (`epochs`, by epoch)."""
        witness = Witness(self.witness_dir, self.shard)
        self.epochs = {e: witness.read(e) for e in range(witness.latest().epoch + 1)}


class KillWithTwoBackups(KillPrimary):
    """KillPrimary, where the shard has two backups: the workers wait at the start of step `at` until the one that
    did not take over follows the one that did, so that the rest of the run streams to it."""

    def __init__(self, cfg: RunConfig, *, push: int, at: int):
        super().__init__(push=push)
        self.until = _Until(cfg, at, self._regrouped, "the second backup never followed the new primary")

    def _regrouped(self) -> bool:
        took = [b for b in self.backups if b.service.replication.follower is None]
        return len(took) == 1 and all(_follows(b, took[0]) for b in self.backups if b is not took[0])

    def step(self, rank: int, step: int) -> None:
        self.until.step(rank, step)


class JoinMidPush(KillPrimary):
    """A fresh backup of shard `shard` asks to join once its primary has applied chunk `chunk` of its `push`-th
    push and not the rest (a whole push where pushes are not chunked: under sync, a barrier half full): the rest of the run's requests wait (as a slow link delivers them) until the primary
    has the join, then come in order. A primary adds a joiner only once no push is half applied (its state would
    hold half a push the stream then finishes), so it adds this one after the push's last chunk. `joined_with` and
    `admitted_with`: the chunks of an open push the primary had applied when the join came and when it added the
    backup. The workers wait at the start of step `at` until it follows."""

    witness = True  # the shard gets a witness without replicas: a primary takes backups only with one

    def __init__(self, cfg: RunConfig, *, push: int, chunk: int, at: int, shard: int = 0):
        super().__init__(push=push, shard=shard, chunk=chunk)
        self.backup: Server | None = None
        self.joined_with: int | None = None
        self.admitted_with: int | None = None
        self.admitted_arrived: list[int] | None = None  # under sync: the workers whose push of the open clock it held
        self.held: list = []
        self.until = _Until(cfg, at, lambda: self.backup is not None and _follows(self.backup, self.primary),
                            "the backup that asked mid-push never followed")

    def step(self, rank: int, step: int) -> None:
        self.until.step(rank, step)

    def started(self, servers: list[Server], backups: list[Server], witness: str) -> None:
        Watch.started(self, servers, backups, witness)
        self.primary = servers[self.shard]
        service = self.primary.service
        replicas = service.replication.replicas
        handle, tick, admit = service.handle, replicas.tick, replicas._admit

        def applied() -> int:
            return sum(p.applied for p in service.pushes.chunks.open.values())

        def holding(peer, frames: list) -> None:  # the primary's loop thread
            if self.backup is not None and self.joined_with is None and not stream.is_stream(frames):
                self.held.append((peer, frames))
                return
            msg = self._due(frames) if self.death is None else None
            handle(peer, frames)
            if msg is not None:
                self.death = self._record(service, msg)
                self.backup = self.server(dataclasses.replace(
                    self.primary.cfg, bind="tcp://127.0.0.1:0", backup_of=self.primary.address,
                    witness=self.witness_dir)).start()
                self.backups.append(self.backup)  # stopped and recorded at the end, like the others

        def ticking() -> None:
            if self.backup is not None and self.joined_with is None and replicas.joining:
                self.joined_with = applied()
            tick()
            if self.joined_with is not None and self.held:
                held, self.held = self.held, []
                for peer, frames in held:
                    handle(peer, frames)

        def admitting(address: str) -> bool:
            self.admitted_with = applied()
            self.admitted_arrived = sorted(getattr(service.controller, "arrived", ()))
            return admit(address)
        service.handle, replicas.tick, replicas._admit = holding, ticking, admitting
