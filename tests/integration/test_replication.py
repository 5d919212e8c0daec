"""Replicated shards (psrv/server/replication/): a backup that follows its primary's stream holds
exactly the primary's state, weights, optimizer state, clocks and exactly-once table, whether it followed
from the first request or joined while the workers were pushing. Shards and workers are threads of the
test process on 127.0.0.1 (what is tested is the stream, not processes; psrv run's are in
test_run_replicas.py)."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

import psrv
from psrv.config import ServerConfig
from tests.states import assert_same_state

from tests.replica_cluster import (STEPS, following as _following, run_workers as _run, shard as _shard, stall as _stall,
                                   wait_for as _wait)

@pytest.mark.parametrize("mode,workers,optimizer,drop", [("sync", 2, "sgd", 0), ("async", 2, "adam", 0),
                                                         ("ssp", 2, "sgd", 0), ("sync", 3, "sgd", 1)])
def test_a_backup_holds_exactly_the_primary_state(mode, workers, optimizer, drop, tmp_path):
    """drop: sync's backup workers (the slowest push of each clock dropped): the same drops on the backup."""
    # no failover is meant: under two busy loops beside three pytest processes, a primary in this process went
    # 1.1 s without a word to its backup, which took over at the default bound (1 s)
    quiet = {"failure_bound": 5.0}
    primary = _shard(mode, workers=workers, optimizer=optimizer, drop=drop, witness=tmp_path, **quiet)
    backup = _shard(mode, workers=workers, backup_of=primary.address, optimizer=optimizer, drop=drop, witness=tmp_path,
                    **quiet)
    try:
        _wait(lambda: _following(backup))
        for t in _run(primary.address, workers):
            t.join(60)
        ours, theirs = primary.join(30), backup.join(30)
        assert ours["version"] > 0 and ours["backups"] == [backup.address]
        assert theirs["role"] == "backup" and theirs["version"] == ours["version"]
        assert theirs["dropped"] == ours["dropped"] and (sum(ours["dropped"].values()) > 0) == (drop > 0)
        assert_same_state(primary.service.state_dict(), backup.service.state_dict())
    finally:
        for s in (primary, backup):
            s.stop()


@pytest.mark.parametrize("pull,fragments", [("", 1), ("randomk:0.1", 1), ("", 2), ("randomk:0.1", 2)])
def test_a_backup_that_joins_while_workers_push_catches_up_from_the_state(pull, fragments, tmp_path):
    """pull: compressed pulls, whose per-worker copies (mirror, number, random-k's stream) travel with the
    state; without them the backup would refuse the workers' next pull as from an unknown copy, and miss
    the push that came with it. fragments: streaming DiLoCo, whose per-fragment outer optimizers (in the
    checkpoint state) travel with the state too; without them the backup would step each fragment's momentum
    from zero. Both: which fragments each mirror knows and their pulls since dense travel as well."""
    primary = _shard("sync", workers=2, witness=tmp_path)
    started, go = threading.Event(), threading.Event()
    backup = None
    try:
        threads = _run(primary.address, 2, steps=60, started=started, go=go, pull=pull, fragments=fragments)
        assert started.wait(60)  # worker 0 waits at its step 20, worker 1 in the barrier, its pull pending
        backup = _shard("sync", workers=2, backup_of=primary.address, witness=tmp_path)
        _wait(lambda: primary.service.replication.replicas.joining or primary.service.replication.replicas.backups)
        go.set()
        for t in threads:
            t.join(60)
        ours, theirs = primary.join(30), backup.join(30)
        assert theirs["role"] == "backup" and 0 < theirs["version"] == ours["version"] == 60
        assert theirs["errors"] == ours["errors"] == 0, (theirs["errors"], ours["errors"])
        assert_same_state(primary.service.state_dict(), backup.service.state_dict())
        assert_same_state(primary.service.pulls.copies.state_dict(), backup.service.pulls.copies.state_dict(), "pulls")
        assert_same_state(primary.service.state.fragments.state_dict(), backup.service.state.fragments.state_dict(),
                          "fragments")
        assert len(primary.service.state.fragments.state_dict()["fragments"]) == (fragments if fragments > 1 else 0)
    finally:
        for s in (primary, backup):
            if s is not None:
                s.stop()


def _weights(server: psrv.Server) -> torch.Tensor:
    return server.service.shard.weights.clone()


def test_a_sync_run_whose_primary_dies_ends_with_the_weights_of_the_run_without_it(tmp_path):
    """The primary stops answering at worker 0's step 10 of 30 (its loop ends: nothing more leaves it); the
    backup takes over and the workers re-send there. Sync's math is the same only if every acknowledged
    update survived and none was applied twice: one lost clock moves the weights by about lr * |g|."""
    plain = _shard("sync", workers=2, witness=tmp_path / "plain")
    for t in _run(plain.address, 2):
        t.join(60)
    plain.join(30)
    took, weights = _failover(tmp_path, "sync")
    assert took["version"] == STEPS
    assert torch.equal(weights, _weights(plain))


@pytest.mark.parametrize("mode,optimizer", [("async", "adam"), ("ssp", "sgd")])
def test_across_a_failover_every_acknowledged_push_is_applied_once_and_ssp_keeps_its_bound(mode, optimizer, tmp_path):
    """Every step of psrv.Worker is a push acknowledged to it: the shard that took over applied exactly
    that many, and under ssp (staleness 1) no pull was answered further ahead than the bound, before or
    after the failover (the backup's counts include what it applied as a backup)."""
    took, _ = _failover(tmp_path, mode, optimizer=optimizer)
    assert took["updates_applied"] == took["version"] == 2 * STEPS
    if mode == "ssp":
        assert took["max_clock_gap"] <= 1


def test_across_a_failover_sync_with_a_backup_worker_takes_every_push_once(tmp_path):
    """Sync with 3 workers and backup_workers 1: each clock steps on the first 2 pushes and the third is
    dropped as late, on the primary and then on the backup that took over; every push acknowledged to a
    worker was taken once there, applied or dropped, none twice (a re-sent one is a duplicate)."""
    took, _ = _failover(tmp_path, "sync", workers=3, drop=1)
    assert took["pushes"] == 3 * STEPS and took["dropped"]["late"] > 0
    assert took["pushes_applied"] + took["dropped"]["late"] == took["pushes"]
    assert took["updates_applied"] == took["version"] and took["lost_clocks"] == 0


def test_a_worker_moves_to_the_backup_when_its_primary_connection_breaks_not_after_its_probes(tmp_path, caplog):
    """A primary whose process ends (here its loop and socket) breaks the workers' connections: they re-send to
    the backup at once (it holds the requests until it takes over), not once a probe went unanswered (3/5 of the
    bound, 1.2 s here, after the backup's 1 s); every push is still applied once."""
    caplog.set_level(logging.WARNING, logger="psrv.client.psclient")
    took, _ = _failover(tmp_path, "async", workers=1, failure_bound=2.0)
    assert took["updates_applied"] == STEPS
    moves = [r.getMessage() for r in caplog.records if "trying its replica" in r.getMessage()]
    assert moves and all("connection broke" in m for m in moves), moves


def _failover(tmp_path, mode: str, optimizer: str = "sgd", workers: int = 2, drop: int = 0,
              failure_bound: float = 1.0) -> tuple[dict, torch.Tensor]:
    """A run whose primary stops at worker 0's step 10: the summary of the backup that took over, and its
    final weights."""
    primary = _shard(mode, workers=workers, optimizer=optimizer, drop=drop, witness=tmp_path,
                     failure_bound=failure_bound)
    backup = _shard(mode, workers=workers, backup_of=primary.address, optimizer=optimizer, drop=drop, witness=tmp_path,
                    failure_bound=failure_bound)
    took = _stop_one_midway(primary, backup, stop=primary, workers=workers)
    assert took["role"] == "primary" and [f["epoch"] for f in took["failovers"]] == [2]  # 0 start, 1 its join
    return took, _weights(backup)


def _stop_one_midway(primary: psrv.Server, backup: psrv.Server, *, stop: psrv.Server, workers: int) -> dict:
    """Workers train against `primary` (with `backup` following); `stop` (one of the two) stops at worker 0's
    step 10, the workers finish, and the other's summary is returned."""
    other = backup if stop is primary else primary
    started = threading.Event()
    try:
        _wait(lambda: _following(backup))
        threads = _run(primary.address, workers, started=started)
        assert started.wait(60)
        stop.stop()
        stop.join(30)
        for t in threads:
            t.join(60)
            assert not t.is_alive()
        return other.join(30)
    finally:
        for s in (primary, backup):
            s.stop()


def test_a_paused_primary_is_replaced_and_fenced_when_it_comes_back(tmp_path):
    """A primary paused past the takeover bound (and the backup's last question to it) is replaced by its
    backup at the next epoch; when it comes back, its stream is refused ("fenced") and it stops without
    answering: no two primaries."""
    primary = _shard("async", workers=1, witness=tmp_path)
    backup = _shard("async", workers=1, backup_of=primary.address, witness=tmp_path)
    try:
        _wait(lambda: _following(backup))
        _stall(primary, 3.0)
        _wait(lambda: backup.service.replication.follower is None)
        assert backup.service.replication.replicas.epoch == 2 and not backup.service.replication.replicas.fenced
        ours = primary.join(20)
        assert ours["fenced"] and ours["role"] == "primary"
    finally:
        for s in (primary, backup):
            s.stop()


def test_a_dead_backup_is_dropped_and_the_primary_goes_on_alone(tmp_path):
    """A backup that stops acknowledging is dropped at a new epoch after the ack timeout (the failure bound,
    shortened here); the primary, which holds everything, answers on and applies every push."""
    primary = _shard("async", workers=2, witness=tmp_path, failure_bound=0.5)  # an ack timeout of 0.5 s
    # the backup's own bound long: with 0.5 s it claimed the shard once, when the primary, a thread of this process,
    # went 2.3 s without a word under a loaded suite, and the primary stopped, fenced, before the backup did
    backup = _shard("async", workers=2, backup_of=primary.address, witness=tmp_path, failure_bound=10.0)
    ours = _stop_one_midway(primary, backup, stop=backup, workers=2)
    assert ours["backups"] == [] and not ours["fenced"] and ours["updates_applied"] == 2 * STEPS


def test_a_backup_answers_stats_as_a_backup(tmp_path):
    """psrv top and psrv admin reach a backup too: it answers STATS itself, saying it is one."""
    from psrv.transport import create_client
    from psrv.protocol import Message, MsgType, decode, encode
    primary = _shard("async", workers=1, witness=tmp_path)
    backup = _shard("async", workers=1, backup_of=primary.address, witness=tmp_path)
    link = create_client("zmq", [backup.address])
    try:
        _wait(lambda: _following(backup))
        link.send(0, encode(Message(MsgType.STATS, seq=7)))
        got = link.recv(10.0)
        assert got is not None
        reply = decode(got[1])
        assert reply.type is MsgType.STATS and reply.seq == 7 and reply.fields["role"] == "backup"
    finally:
        link.close()
        for s in (primary, backup):
            s.stop()


def test_a_backup_announces_its_address_only_once_it_follows(tmp_path):
    """`psrv run` starts the workers once each backup's ready file is there (experiments/launcher/replication.py
    wait_following): it must mean the backup follows, or a worker welcomed before the backup joined is told of
    no replica to fail over to, and the backup counts fewer pushes than its primary. The backup here is bound
    and asking to join an address where its primary does not serve yet."""
    from psrv.atomic import write_text
    from psrv.experiments.launcher.cluster import free_port
    from psrv.server.run import serve
    address = f"tcp://127.0.0.1:{free_port()}"
    primary_file, backup_file, started = tmp_path / "server-0.addr", tmp_path / "backup-0-1.addr", []
    write_text(primary_file, address)
    cfg = ServerConfig(workers=1, mode="async", backup_of=f"@{primary_file}", witness=str(tmp_path / "witness"))
    thread = threading.Thread(target=serve, args=(cfg,), kwargs={"ready_file": backup_file, "on_ready": started.append},
                              daemon=True)
    thread.start()
    _wait(lambda: started)
    time.sleep(1.0)  # bound, and asking to join every 0.5 s
    assert not backup_file.exists() and not _following(started[0])
    primary = psrv.Server(ServerConfig(workers=1, mode="async", bind=address, witness=str(tmp_path / "witness"))).start()
    try:
        _wait(lambda: backup_file.exists())
        assert _following(started[0]) and backup_file.read_text() == started[0].address
        assert primary.service.replication.replicas.addresses == [primary.address, started[0].address]
    finally:
        started[0].stop()
        primary.stop()
        thread.join(timeout=20)


def test_a_join_said_before_the_backup_was_added_changes_nothing(tmp_path):
    """A backup says "join" every 0.25 s until the state comes, so joins queue while its primary starts and cross
    the state on the way: one of an epoch before the backup's admission is stale, and must not add it again (a
    second admission drops it from the replicas the workers are told, and sends the state again)."""
    from psrv.server.replication import stream
    from psrv.transport import create_client
    primary = _shard("async", workers=1, witness=tmp_path)
    backup = _shard("async", workers=1, backup_of=primary.address, witness=tmp_path)
    link = create_client("zmq", [primary.address])
    try:
        _wait(lambda: _following(backup))
        replicas = primary.service.replication.replicas
        epoch = replicas.epoch
        link.send(0, stream.frames_of("join", 0, address=backup.address))
        time.sleep(0.5)
        assert (replicas.admitted, replicas.epoch, replicas.addresses) == (1, epoch, [primary.address, backup.address])
    finally:
        link.close()
        for s in (backup, primary):
            s.stop()


def test_a_backup_sends_a_worker_back_to_its_live_primary(tmp_path):
    """A worker whose primary stalled on a backup's late ack tries the next replica after 3F/5: a backup whose
    primary lives answers it NOT_PRIMARY naming the primary (nothing applied), so the worker goes back at once
    instead of waiting there and at every other replica in turn (the chaos run: a 2 s late ack stopped every
    worker about 2.5 s, then half of them for 1.5 s more)."""
    from psrv.protocol import ErrorCode, Message, MsgType, decode, encode
    from psrv.transport import create_client
    primary = _shard("async", workers=1, witness=tmp_path)
    backup = _shard("async", workers=1, backup_of=primary.address, witness=tmp_path)
    link = create_client("zmq", [backup.address])
    try:
        _wait(lambda: _following(backup))
        link.send(0, encode(Message(MsgType.HEARTBEAT, worker=0, seq=5, fields={"probe": 5})))
        got = link.recv(5.0)
        assert got is not None, "the backup held the request"
        reply = decode(got[1])
        assert (reply.type, reply.seq, reply.fields["code"]) == (MsgType.ERROR, 5, ErrorCode.NOT_PRIMARY)
        assert reply.fields["replicas"][0] == primary.address
        assert backup.service.shard is None or backup.service.shard.version == 0
    finally:
        link.close()
        for s in (backup, primary):
            s.stop()
