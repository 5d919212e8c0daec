"""One case of the matrix run for real, in this process: every shard a psrv.Server served from a thread
on 127.0.0.1, every worker a thread driving psrv.Worker through the loop psrv's own workers run
(workers/loop.py: batch, loss, backward, the inner step with local steps, ps.step()). With
cluster.replicas, each shard's backups (psrv.Server threads with backup_of, as `psrv run --replicas`
starts them) follow it before any worker starts, so every acknowledged push went through the stream.

The order is fixed, so a run repeats bit for bit: in sync (without backup workers or a quorum) the two workers
run free, as the mean of two gradients does not depend on their order; everywhere else they take
turns, one whole step each (push, apply, pull), who goes first rotating from step to step (`order`).

`hooks` (Hooks) lets a failure case (tests/conformance/failures.py) act on a run: kill a primary at a chosen
push, add a backup or restart a shard from its checkpoint at a chosen step."""
from __future__ import annotations

import dataclasses
import io
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from psrv.client.admin import admin_request
from psrv.client.psclient import PSError
from psrv.config import RunConfig
from psrv.history import ENV as HISTORY_ENV, History
from psrv.protocol import MsgType
from psrv.server.run import Server
from psrv.client import Worker
from psrv.client.steplog import StepLog
from tests.conformance import job as tiny

TIMEOUT = 60.0


@dataclass
class Outcome:
    """What a run left: rank 0's final weights, each shard's summary, each worker's step rows
    (psrv/client/steplog.py ROW, as its record holds them) and errors."""

    params: torch.Tensor
    shards: list[dict]
    steps: dict[int, list[dict]] = field(default_factory=dict)
    errors: dict[int, PSError] = field(default_factory=dict)
    early_sends: dict[int, int] = field(default_factory=dict)  # shard pushes sent during backward
    wire: dict[int, dict] = field(default_factory=dict)  # each worker's psrv.Worker.wire_bytes()
    in_place: dict[int, tuple[int, int]] = field(default_factory=dict)  # each worker's pulls (read in place, copied)
    backups: list["BackupRecord"] = field(default_factory=list)


@dataclass
class BackupRecord:
    """A backup at the end of a run: its shard, address, summary and state (cluster._state), beside its
    primary's."""

    shard: int
    address: str
    summary: dict
    state: dict
    primary_state: dict


class Hooks:
    """What a failure case does to a run (tests/conformance/failures.py); these defaults do nothing.
    `witness`: the shards get one even without replicas (a backup may join later); `history`: a folder where the
    replicas and workers record their histories (docs/history.md), for `psrv check`'s rules; `server_config(config)`:
    each shard's config as given to its primary and backups (a checkpoint dir); `server(config)`: a replica built
    from it; `started(servers, backups, witness)`:
    the shards once they serve, before any worker starts (lists the hook may change in place: a server replaced,
    a backup added, each stopped and recorded at the end); `step(rank, step)`: at the start of each worker's
    step, in its turn; `finished()`: once every worker has ended."""

    witness = False
    history: str | None = None  # a folder: every replica and worker records its history there (docs/history.md)

    def server_config(self, config):
        return config

    def server(self, config) -> Server:
        """A shard's replica (a primary, a backup, a restarted shard), recording into `history` where set: one
        file per replica life, as `psrv serve` writes DIR/history/shard-K.PID.jsonl."""
        faults = self.faults(config)
        if self.history is None:
            return Server(config, faults=faults)
        self._histories = getattr(self, "_histories", [])
        history = History(Path(self.history) / f"shard-{config.shard}.{len(self._histories) + 1}.jsonl")
        self._histories.append(history)
        return Server(config, history=history, faults=faults)

    def faults(self, config):
        """The injected faults (psrv/server/faults.py InjectedFaults) a replica started with `config` obeys, given
        to it at its start as `psrv serve` gives the nemesis's: none here."""
        return None

    def close_histories(self) -> None:
        for history in getattr(self, "_histories", ()):
            history.close()

    def started(self, servers: list[Server], backups: list[Server], witness: str) -> None:
        pass

    def step(self, rank: int, step: int) -> None:
        pass

    def finished(self) -> None:
        """Once every worker has ended, before the shards are joined."""

    def restarts(self, rank: int, step: int) -> bool:
        """Whether worker `rank` is restarted before its step `step` (after `step(rank, step)`): its psrv.Worker
        closed, and a new one loaded from the old one's state_dict (through torch.save's bytes)."""
        return False

    def restarted(self, rank: int, step: int, state: dict) -> None:
        """After worker `rank`'s restart before `step`, from `state`; in every worker's thread where the
        workers run free, so that none goes on while one is restarting."""


def order(step: int, ranks: list[int]) -> list[int]:
    """Who takes a step's turns, first to last: the ranks rotated by the step (0, 1; then 1, 0; ...), so
    with backup workers each is late in turn, and under async each pushes on fresh and on stale weights."""
    k = step % len(ranks)
    return ranks[k:] + ranks[:k]


class Turns:
    """The workers' turns, one whole step each, in `order`; a worker that stops gives up its turns.
    `wait` returns the turn's ticket; `done(ticket)` passes it on (once: a second call does nothing)."""

    def __init__(self, ranks: list[int], steps: int, *, free: bool):
        self.schedule = [r for step in range(steps) for r in order(step, ranks)]
        self.at, self.free, self.stopped = 0, free, set()
        self.cond = threading.Condition()

    def _head(self) -> int | None:
        while self.at < len(self.schedule) and self.schedule[self.at] in self.stopped:
            self.at += 1
        return self.schedule[self.at] if self.at < len(self.schedule) else None

    def wait(self, rank: int) -> int:
        with self.cond:
            if not self.cond.wait_for(lambda: self.free or self._head() == rank, TIMEOUT):
                raise TimeoutError(f"worker {rank} never got its turn")
            return self.at

    def done(self, ticket: int) -> None:
        with self.cond:
            if not self.free and self.at == ticket:
                self.at += 1
            self.cond.notify_all()

    def stop(self, rank: int) -> None:
        with self.cond:
            self.stopped.add(rank)
            self.cond.notify_all()


class Handled:
    """Passes a turn on once every shard has handled the push it made, without waiting for the step to
    end: under sync with backup workers a push that does not close its clock (a skipped NaN) waits at
    the shards for the next worker's. Watches each shard's STATS `pushes` count."""

    def __init__(self, addresses: list[str], turns: Turns, ticket: int):
        self.addresses, self.turns, self.ticket = addresses, turns, ticket
        self.before = self._pushes()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _pushes(self, timeout: float = TIMEOUT) -> list[int]:
        return [admin_request(a, MsgType.STATS, timeout=timeout)["pushes"] for a in self.addresses]

    def _watch(self) -> None:
        """Polls with a short timeout: once its worker was refused and the others finished, the shards stop,
        and close() must not wait out a long one."""
        while not self.stop.wait(0.005):
            try:
                pushes = self._pushes(timeout=1.0)
            except TimeoutError:
                continue
            if all(now > was for now, was in zip(pushes, self.before)):
                self.turns.done(self.ticket)
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT)


def start_backups(cfg: RunConfig, servers: list[Server], witness: str, hooks: Hooks | None = None) -> list[Server]:
    """cfg.cluster.replicas backups of each shard, returned once each follows its primary's stream and the
    primary counts it among its live backups (else the case would not take the replication path)."""
    hooks = hooks or Hooks()
    backups: list[Server] = []
    try:
        for shard, primary in enumerate(servers):
            for _ in range(cfg.cluster.replicas):
                config = hooks.server_config(cfg.server_config(shard, bind="tcp://127.0.0.1:0"))
                backups.append(hooks.server(dataclasses.replace(config, backup_of=primary.address, witness=witness)).start())
        deadline = time.monotonic() + TIMEOUT
        for b in backups:
            primary = servers[b.cfg.shard]
            while not (b.service.replication.follower is not None and b.service.replication.follower.following
                       and b.address in primary.service.replication.replicas.addresses[1:]):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the backup of shard {b.cfg.shard} never followed {primary.address}")
                time.sleep(0.01)
    except BaseException:
        for b in backups:
            b.stop()
        raise
    return backups


def _state(server: Server) -> dict:
    """A shard's whole state: its state_dict, the workers' compressed-pull copies and the per-fragment outer
    optimizers beside it."""
    service = server.service
    return {**service.state_dict(), "pulls": service.pulls.copies.state_dict(),
            "fragments": service.state.fragments.state_dict()}


def run(cfg: RunConfig, *, nan: bool, hooks: Hooks | None = None) -> Outcome:
    hooks = hooks or Hooks()
    if hooks.history is None:
        return _run(cfg, nan=nan, hooks=hooks)
    before = os.environ.get(HISTORY_ENV)
    os.environ[HISTORY_ENV] = hooks.history  # each psrv.Worker records worker-R.PID.jsonl there
    try:
        return _run(cfg, nan=nan, hooks=hooks)
    finally:
        if before is None:
            os.environ.pop(HISTORY_ENV, None)
        else:
            os.environ[HISTORY_ENV] = before


def _run(cfg: RunConfig, *, nan: bool, hooks: Hooks) -> Outcome:
    witness = tempfile.TemporaryDirectory(prefix="psrv-witness-")  # the shards' epochs, with replicas
    on = {"witness": witness.name} if cfg.cluster.replicas or hooks.witness else {}
    servers = [hooks.server(dataclasses.replace(hooks.server_config(cfg.server_config(s, bind="tcp://127.0.0.1:0")),
                                          **on)).start() for s in range(cfg.cluster.servers)]
    addresses = [s.address for s in servers]
    backups: list[Server] = []
    try:
        backups += start_backups(cfg, servers, witness.name, hooks)
        hooks.started(servers, backups, witness.name)
    except BaseException:
        for s in servers + backups:
            s.stop()
        witness.cleanup()
        raise
    n = cfg.cluster.workers
    turns = Turns(list(range(n)), cfg.job.steps, free=cfg.mode == "sync" and not cfg.backup_workers and not cfg.quorum)
    ready = threading.Barrier(n, timeout=TIMEOUT)
    out = Outcome(params=torch.empty(0), shards=[])
    failures: list[BaseException] = []

    jobs = [(tiny.tiny_nan if nan else tiny.tiny)(cfg.seed) for _ in range(n)]  # here: torch's seed is global

    def work(rank: int) -> None:
        try:
            params = _worker(cfg, rank, jobs[rank], addresses, turns=turns, ready=ready, out=out, hooks=hooks)
            if rank == 0:
                out.params = params
        except BaseException as exc:  # handed to the test
            failures.append(exc)
            ready.abort()
            turns.stop(rank)

    threads = [threading.Thread(target=work, args=(r,), name=f"worker-{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    try:
        hooks.finished()
        out.shards = [s.join(TIMEOUT) for s in servers]
        for b in backups:  # every op its primary answered is in it: ended now, not a failure bound after
            b.stop()
        out.backups = [BackupRecord(b.cfg.shard, b.address, b.join(TIMEOUT), _state(b), _state(servers[b.cfg.shard]))
                       for b in backups]
    finally:
        for s in servers + backups:
            s.stop()
        witness.cleanup()
    if failures:
        raise failures[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError("a worker was still running")
    return out


def _worker(cfg: RunConfig, rank: int, job, addresses: list[str], *, turns: Turns,
            ready: threading.Barrier, out: Outcome, hooks: Hooks) -> torch.Tensor:
    w = cfg.worker_config(rank, servers=tuple(addresses))
    model = job.model
    batches = job.batches_for(rank=rank, world_size=w.world_size, batch_size=w.job.batch_size, seed=cfg.seed)
    inner = torch.optim.SGD(model.parameters(), lr=w.inner_lr) if w.local_updates else None
    log = StepLog()  # the rows, with each fragment push's staleness once answered

    def make() -> Worker:  # the run's psrv.Worker for this rank (again, for a restart)
        return Worker(model, w.servers, rank=rank, world_size=w.world_size, transport=w.transport,
                      timeout=w.request_timeout, wire_dtype=w.wire_dtype, overlap=w.overlap,
                      clip_grad_norm=w.clip_grad_norm, local_steps=w.local_steps if w.local_updates else None,
                      fragments=w.fragments, outer_dtype=w.outer_dtype,
                      compress=w.compress, error_feedback=w.error_feedback, compress_min_numel=w.compress_min_numel,
                      error_feedback_decay=w.error_feedback_decay,
                      momentum_correction=w.momentum_correction, momentum_masking=w.momentum_masking,
                      compress_warmup=w.compress_warmup, sign_scale=w.sign_scale,
                      shared_memory=w.shared_memory, bulk=w.bulk, push_chunk_mb=w.push_chunk_mb,
                      compress_pull=w.compress_pull, pull_error_feedback=w.pull_error_feedback,
                      pull_resync=w.pull_resync, pull_extrapolate=w.pull_extrapolate,
                      pull_in_place=w.pull_in_place, step_log=log)

    ps = make()
    out.steps[rank] = log.rows
    # a push may wait for the next worker's (sync with backup workers, a quorum's fresh push under --quorum-wait); a
    # fragment push (streaming DiLoCo) returns before it is handled: either way the turn passes once the shards
    # have handled it
    streaming = w.fragments > 1
    hand_off = cfg.mode == "sync" and (cfg.backup_workers or cfg.quorum_wait) or streaming
    ready.wait()
    try:
        for step in range(w.job.steps):
            ticket = turns.wait(rank)
            hooks.step(rank, step)
            state = None
            if hooks.restarts(rank, step):  # a restarted process: a new psrv.Worker from the saved state
                buf = io.BytesIO()
                torch.save(ps.state_dict(), buf)
                ps.close()
                ps = make()
                state = torch.load(io.BytesIO(buf.getvalue()))
                ps.load_state_dict(state)
            hooks.restarted(rank, step, state)
            pushes = not w.local_updates or (step + 1) % (w.local_steps // w.fragments) == 0
            # counted before backward: with early sends the shards may handle the push during it
            handled = Handled(addresses, turns, ticket) if hand_off and pushes else None
            loss = job.loss_of(model, next(batches))
            loss.backward()
            if inner is not None:
                inner.step()
            try:
                ps.step()
            except PSError as exc:  # refused (--nonfinite reject): psrv.Worker has left its shards
                out.errors[rank] = exc
                return parameters_to_vector(model.parameters()).detach().clone()
            finally:
                if handled is not None:
                    if streaming and rank not in out.errors:
                        handled.thread.join(TIMEOUT)  # the push handled: only then may the next turn begin
                    handled.close()
            if not (streaming and pushes):  # Handled passed it on
                turns.done(ticket)
        ps.close()
        out.early_sends[rank] = ps.early_sends
        out.wire[rank] = ps.wire_bytes()
        out.in_place[rank] = (ps._client.in_place.read, ps._client.in_place.copied)
    finally:
        turns.stop(rank)
    return parameters_to_vector(model.parameters()).detach().clone()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread, as psrv run gives each of its processes on this 2-core machine (and as the RPC
    cases are told): a matmul's sums, and so the weights to the last bit, depend on the thread count. A test
    module takes it with `from tests.conformance.cluster import one_thread`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
