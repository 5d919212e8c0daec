"""The faults of the conformance matrix's failure cases (tests/conformance/test_failures.py), each a cluster.Hooks
that records what it saw when it fired, so a case can assert that its fault really happened: a replicated
shard's primary that dies at a chosen push (KillPrimary), a backup that joins after a chosen step (JoinBackup),
the shards stopped after a chosen step and resumed from their checkpoints (Resume), a worker restarted from its
state_dict (RestartWorker). A primary paused, a late ack and two backups: tests/conformance/replica_faults.py."""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from psrv.config import RunConfig, from_dict
from psrv.config.optimizer import NESTEROV_RULES
from psrv.protocol import MsgType, ProtocolError, decode
from psrv.server.replication import stream
from psrv.server.run import Server
from tests.conformance.cluster import TIMEOUT, Hooks

JOB = "tests/conformance/job.py:tiny"  # the matrix's job (tests/conformance/job.py)
SEED, BATCH = 3, 16
FAILURE_BOUND = 2.0  # seconds: a backup takes over after 1 s of its primary's silence, a primary drops a backup after
# 2 s without an ack (psrv/timeouts.py). psrv's default, 1 s, took a live primary over in a fresh-clone run: its thread,
# starved by the suite's three jobs on 2 cores, was silent 0.52 s before the fault the case injects came
QUIET_BOUND = 5.0  # where no failover is meant (the runs without a fault, a backup joining): under two busy loops
# beside three pytest processes on 2 cores, a primary in this process went 2.4 s without a word to its backup
PUSHES = (MsgType.PUSH, MsgType.PUSH_PULL)


def config(mode: str, *, steps: int = 6, shards: int = 1, replicas: int = 0, chunk_mb: float = 0.0,
           optimizer: str = "sgd", local: int = 1, fragments: int = 1, outer: str = "float32",
           plane: str = "inline", rule: str = "plain", compress: str = "", quorum: int = 0, grace: float = 0.0,
           workers: int = 2, failure_bound: float = FAILURE_BOUND, wire: str = "float32") -> RunConfig:
    """A failure case's run: the matrix's tiny job on two workers; sgd is SGD with momentum 0.9 (its state must
    survive the fault), adam Adam; `chunk_mb` > 0 chunks pushes (async and ssp apply them chunk by chunk);
    tensors inline (the matrix's plain path) or over the shm plane (`plane` "shm", psrv's default on one host,
    where a push of the worker's shared gradient goes whole and one of another dtype, `wire`, in chunks);
    `rule` the shards' update rule (its state must survive the fault too); `compress` the push codec (with error
    feedback, and momentum correction under sgd); `quorum` and `grace` sync's merges (--quorum, --quorum-grace);
    `workers` another count of workers."""
    optim = {"name": "sgd", "lr": 0.05, "momentum": 0.9} if optimizer == "sgd" else {"name": optimizer, "lr": 0.003}
    optim.update(update_rule=rule, **({"nesterov": True} if rule in NESTEROV_RULES else {}))  # dn, heloco: their own Nesterov
    worker = {"push_chunk_mb": chunk_mb, "local_steps": local, "fragments": fragments, "outer_dtype": outer,
              "wire_dtype": wire,
              "request_timeout": 30.0, "compress": compress}
    if local > 1:
        worker.update(inner_optimizer="sgd", inner_lr=0.05)
    return from_dict(RunConfig, {
        "mode": mode, "staleness": 1, "seed": SEED, "quorum": quorum, "quorum_grace": grace,
        "cluster": {"servers": shards, "workers": workers, "replicas": replicas,
                    "shared_memory": "auto" if plane == "shm" else "off"},
        "job": {"name": JOB, "steps": steps, "batch_size": BATCH}, "optimizer": optim, "worker": worker,
        "server": {"worker_timeout": 30.0, "failure_bound": failure_bound}})


def quiet(cfg: RunConfig) -> RunConfig:
    """`cfg` where no failover is meant: the failure bound QUIET_BOUND (the math is the same at any bound)."""
    return dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, failure_bound=QUIET_BOUND))


def free(cfg: RunConfig) -> bool:
    """Whether the workers run free (cluster.py: sync without backup workers) rather than in turns."""
    return cfg.mode == "sync" and not cfg.backup_workers and not cfg.quorum


def state_of(server: Server) -> dict:
    """A shard's whole state, as cluster.py compares a backup's with its primary's: its state_dict, the workers'
    compressed-pull copies and the per-fragment outer optimizers."""
    s = server.service
    return {**s.state_dict(), "pulls": s.pulls.copies.state_dict(), "fragments": s.state.fragments.state_dict()}


class Watch(Hooks):
    """Keeps the run's servers and backups (the lists cluster.run serves), to read their state at the end."""

    def started(self, servers: list[Server], backups: list[Server], witness: str) -> None:
        self.servers, self.backups, self.witness_dir = servers, backups, witness


class AtStep(Watch):
    """Fires once, at the start of step `at` (each worker has done `at` steps), when nothing is in flight: in
    turns, in the turn of the first worker to reach it (the others wait for their turns); where the workers run
    free (sync), once every one of them has reached it."""

    def __init__(self, cfg: RunConfig, at: int):
        self.at, self.fired = at, False
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(cfg.cluster.workers, action=self._fire, timeout=TIMEOUT) \
            if free(cfg) else None

    def step(self, rank: int, step: int) -> None:
        if step != self.at:
            return
        if self._barrier is not None:
            self._barrier.wait()
            return
        with self._lock:
            if not self.fired:
                self._fire()

    def _fire(self) -> None:
        self.fired = True
        self.fire()

    def fire(self) -> None:
        raise NotImplementedError


@dataclass
class Death:
    """What a primary held when it died: the push it died at (its n-th, the worker and seq), the chunk of how
    many, its version, the workers whose push of sync's open clock it held, and the chunks of a half-applied push."""

    push: int
    worker: int
    seq: int
    chunk: int
    chunks: int
    version: int
    arrived: list[int]
    half_applied: int


class KillPrimary(Watch):
    """Shard `shard`'s first primary dies at its `push`-th push (pushes counted by (worker, seq), as they first
    arrive): as its chunk `chunk` arrives (0: the push's first message, or the whole push), before touching it;
    or with `unanswered`, once it has handled that message (its backups hold it) and before any answer leaves.
    It dies as a stopped shard does (its loop ends, its sockets close): nothing more leaves it."""

    def __init__(self, *, push: int, shard: int = 0, chunk: int = 0, unanswered: bool = False):
        self.push, self.shard, self.chunk, self.unanswered = push, shard, chunk, unanswered
        self.death: Death | None = None
        self._seen: list[tuple[int, int]] = []

    def started(self, servers: list[Server], backups: list[Server], witness: str) -> None:
        super().started(servers, backups, witness)
        self.primary = servers[self.shard]
        service = self.primary.service
        handle = service.handle

        def dying(peer, frames: list) -> None:  # the primary's loop thread
            msg = self._due(frames) if self.death is None else None
            if msg is None:
                handle(peer, frames)
                return
            self.death = self._record(service, msg)
            if self.unanswered:
                service.sent = lambda *args: None  # its replies, held for the backups' acks, never leave
                handle(peer, frames)
            service.stop()
        service.handle = dying

    def _due(self, frames: list):
        """The message at which the primary dies, or None."""
        if stream.is_stream(frames):
            return None
        try:
            msg = decode(frames)
        except ProtocolError:
            return None
        if msg.type not in PUSHES:
            return None
        key = (msg.worker, msg.seq)
        if key not in self._seen:
            self._seen.append(key)
        chunk = msg.fields.get("chunk", [0, 1])[0]
        return msg if self._seen.index(key) + 1 == self.push and chunk == self.chunk else None

    def _record(self, service, msg) -> Death:
        arrived = sorted(getattr(service.controller, "arrived", ()))
        half = sum(p.applied for p in service.pushes.chunks.open.values())
        chunks = msg.fields.get("chunk", [0, 1])[1]
        return Death(self.push, msg.worker, msg.seq, self.chunk, chunks, service.shard.version, arrived, half)

    def took_over(self) -> Server:
        """The backup that serves the shard now."""
        took = [b for b in self.backups if b.cfg.shard == self.shard and b.service.replication.follower is None]
        assert len(took) == 1, f"shard {self.shard}: {len(took)} backups took over"
        return took[0]


@dataclass
class Joined:
    """A backup that joined: its address, and its version once it followed (its primary's then)."""

    address: str
    version: int
    primary_version: int


class JoinBackup(AtStep):
    """At step `at`, a fresh backup of shard `shard` asks its primary to join (psrv serve --backup-of), and the
    workers go on once it follows and the primary counts it among its backups; cluster.run then stops it and
    records it like the others. The shards get a witness even without replicas (a primary takes backups only
    with one)."""

    witness = True

    def __init__(self, cfg: RunConfig, at: int, *, shard: int = 0):
        super().__init__(cfg, at)
        self.shard = shard
        self.joined: Joined | None = None

    def fire(self) -> None:
        primary = self.servers[self.shard]
        backup = self.server(dataclasses.replace(primary.cfg, bind="tcp://127.0.0.1:0", backup_of=primary.address,
                                            witness=self.witness_dir)).start()
        self.backups.append(backup)  # stopped and recorded at the end, like the others
        deadline = time.monotonic() + TIMEOUT
        while not (backup.service.replication.follower.following
                   and backup.address in primary.service.replication.replicas.addresses[1:]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the backup of shard {self.shard} never followed {primary.address}")
            time.sleep(0.01)
        self.joined = Joined(backup.address, backup.service.shard.version, primary.service.shard.version)


class Resume(AtStep):
    """At step `at`, each of `shards` is stopped (as SIGTERM stops `psrv serve`: its final checkpoint written)
    and started again on its address with --resume from that checkpoint (as psrv run restarts a shard, from
    `checkpoint_dir`); the workers go on against it. `stopped`: each stopped shard's summary, by shard."""

    def __init__(self, cfg: RunConfig, at: int, checkpoint_dir: Path, *, shards: tuple[int, ...] = (0,)):
        super().__init__(cfg, at)
        self.dir, self.shards = str(checkpoint_dir), shards
        self.stopped: dict[int, dict] = {}

    def server_config(self, config):
        return dataclasses.replace(config, checkpoint_dir=self.dir)

    def fire(self) -> None:
        for shard in self.shards:
            old = self.servers[shard]
            old.stop()
            self.stopped[shard] = old.join(TIMEOUT)
            self.servers[shard] = _restart(dataclasses.replace(old.cfg, bind=old.address, resume=True), self).start()


def _restart(config, hooks: Hooks) -> Server:
    """A Server on the address a stopped one served: its socket lingers a little after its loop ended (0.2 s,
    psrv/transport/zmq.py close), where a restarted process's predecessor had died with its sockets."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return hooks.server(config)
        except ValueError as exc:
            if "already in use" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class RestartWorker(Watch):
    """Worker `rank` restarted before its step `at` (cluster.py Hooks.restarts): the psrv.Worker closed and a new
    one built, loaded from the old one's state_dict, as a user restarts a worker process from its checkpoint.
    In turns, at a step where its turn follows its own last one (no push in between, so the weights it pulls on
    joining are those it held); where the workers run free, the others wait at a barrier until it is back.
    `state` is what it was loaded from."""

    def __init__(self, cfg: RunConfig, at: int, rank: int):
        self.at, self.rank, self.state = at, rank, None
        self._barrier = threading.Barrier(cfg.cluster.workers, timeout=TIMEOUT) if free(cfg) else None

    def restarts(self, rank: int, step: int) -> bool:
        if step == self.at and self._barrier is not None:
            self._barrier.wait()  # every worker has finished its step at - 1
        return (rank, step) == (self.rank, self.at)

    def restarted(self, rank: int, step: int, state: dict | None) -> None:
        if (rank, step) == (self.rank, self.at):
            self.state = state
        if step == self.at and self._barrier is not None:
            self._barrier.wait()  # back: the others may go on

