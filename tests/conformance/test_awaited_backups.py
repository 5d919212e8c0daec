"""A primary told how many backups its world holds waits for them (psrv/server/replication/primary.py `awaiting`,
`early`): over torch RPC, `rpc_backups` says so and the workers' requests are held until that many backups follow,
at most AWAIT_BACKUPS seconds, so no backup joins after the first pushes. The torch RPC cases run it only in
`psrv run` processes; here a zmq primary is given the same count by hand (the config tree refuses `rpc_backups`
without torch RPC), to show in process that the held requests are answered once the backup follows, in the order
they came, and that a primary whose backups never come serves alone after the wait, saying so once."""
from __future__ import annotations

import dataclasses
import logging

import pytest

from psrv.config import ServerConfig
from psrv.protocol import Message, MsgType
from psrv.protocol.codec import decode, encode
from psrv.server.replication import primary as primary_module
from psrv.server.run import Server
from psrv.server.service import ShardService
from psrv.transport.zmq_client import ZmqClient
from tests.conformance.cluster import TIMEOUT, one_thread, start_backups  # noqa: F401 (an autouse fixture)
from tests.conformance.failures import config, quiet
from tests.conformance.replica_pair import QUIET_S, wait_for
from tests.helpers import RecordingNet

WAIT_S = 1.5  # AWAIT_BACKUPS (60 s) for the case whose backup never comes


@pytest.fixture
def awaiting_primary(tmp_path):
    """(cfg, primary, backups): shard 0's primary with a witness, told to expect one backup, started; stopped at the
    end with the backups the case appends to `backups`."""
    cfg = quiet(config("async", replicas=1))
    backups: list[Server] = []
    primary = Server(dataclasses.replace(cfg.server_config(0, bind="tcp://127.0.0.1:0"),
                                         witness=str(tmp_path / "witness")))
    primary.service.replication.replicas.expected = 1  # as `rpc_backups` 1 sets it over torch RPC
    primary.start()
    try:
        yield cfg, primary, backups
    finally:
        for s in (*backups, primary):
            s.stop()
        for s in (*backups, primary):
            s.join(TIMEOUT)


def ask(worker: ZmqClient, seq: int) -> None:
    worker.send(0, encode(Message(MsgType.HEARTBEAT, worker=0, seq=seq, session=7)))


def answers(worker: ZmqClient, count: int, timeout: float = TIMEOUT) -> list[int]:
    seqs = []
    for _ in range(count):
        got = worker.recv(timeout)
        assert got is not None, f"{len(seqs)} of {count} held requests answered"
        seqs.append(decode(got[1]).seq)
    return seqs


def test_requests_wait_for_the_expected_backup_and_are_answered_in_order_once_it_follows(awaiting_primary, tmp_path,
                                                                                        monkeypatch):
    cfg, primary, backups = awaiting_primary
    monkeypatch.setattr(primary_module, "AWAIT_BACKUPS", 10 * TIMEOUT)  # only the backup's coming releases them
    replicas = primary.service.replication.replicas
    worker = ZmqClient([primary.address])
    try:
        for seq in (1, 2, 3):
            ask(worker, seq)
        wait_for("the primary never held the three requests", lambda: len(replicas.early) == 3)
        assert worker.recv(QUIET_S) is None, "a request was answered before the expected backup followed"
        assert len(replicas.early) == 3 and replicas.expected == 1
        backups += start_backups(cfg, [primary], str(tmp_path / "witness"))
        assert answers(worker, 3) == [1, 2, 3]
        assert replicas.early == [] and replicas.expected == 1
        ask(worker, 4)  # with its backup in, a request is served at once
        assert answers(worker, 1) == [4]
    finally:
        worker.close()


def test_a_primary_whose_backups_never_come_serves_alone_after_the_wait_and_says_so(awaiting_primary, monkeypatch,
                                                                                   caplog):
    _, primary, _ = awaiting_primary
    monkeypatch.setattr(primary_module, "AWAIT_BACKUPS", WAIT_S)
    replicas = primary.service.replication.replicas
    worker = ZmqClient([primary.address])
    try:
        with caplog.at_level(logging.WARNING, logger="psrv.server"):
            ask(worker, 1)
            assert worker.recv(QUIET_S) is None, "a request was answered before the wait for the backup ran out"
            assert answers(worker, 1, timeout=WAIT_S + TIMEOUT) == [1]
            assert replicas.state.now() - replicas._started > WAIT_S
            assert replicas.expected == 0 and replicas.early == [] and replicas.backups == []
            ask(worker, 2)
            assert answers(worker, 1) == [2]
        lines = [r.getMessage() for r in caplog.records if r.name == "psrv.server"]
        assert lines.count(f"shard 0: 0 of 1 backups joined within {WAIT_S:g}s; serving without the others") == 1, lines
    finally:
        worker.close()


@pytest.mark.parametrize("backups", [2, 0])
def test_a_torch_rpc_primary_expects_the_backups_its_world_holds(tmp_path, backups):
    """The count of backups a primary holds the workers' requests for (psrv/server/replication/primary.py
    Replicas.__init__) is its config's `rpc_backups`, the backups its torch RPC world holds. The shard is built in
    process from an RPC primary's config (no world is started: the count is read at construction)."""
    cfg = ServerConfig(workers=2, mode="async", transport="rpc", rpc_backups=backups, witness=str(tmp_path / "w"))
    assert ShardService(cfg, RecordingNet()).replication.replicas.expected == backups


class LinkingNet(RecordingNet):
    """RecordingNet that lets the shard link to another replica (a backup's follower links to its primary at
    construction): it notes the address, and the link, another RecordingNet, carries nothing."""

    def __init__(self):
        super().__init__()
        self.linked: list[str] = []

    def link(self, address):
        self.linked.append(address)
        return RecordingNet()


def test_a_backup_expects_no_backups_whatever_its_world_holds(tmp_path):
    """A backup (--backup-of) holds no worker's request for backups of its own, whatever its torch RPC world
    holds: the world's backups are its primary's, and should it take the shard over it serves at once."""
    cfg = ServerConfig(workers=2, mode="async", transport="rpc", rpc_backups=2,
                       bind="rpc://127.0.0.1:29500", backup_of="rpc://127.0.0.1:29500/server-0",
                       witness=str(tmp_path / "w"))
    net = LinkingNet()
    replication = ShardService(cfg, net).replication
    assert net.linked == [cfg.backup_of] and replication.follower is not None
    assert replication.replicas.expected == 0
