"""What a replica does with a replication message that reaches its shard's socket from someone it does not stream
with (psrv/server/replication/handler.py on_stream), a real primary and backup (replica_pair.py `pair`) and a line
of the test's own:

- a stray answer (ack, gap, fenced) reaching a primary is ignored;
- a stream of an older epoch is answered "fenced", one of the primary's own epoch is not answered;
- a stream of a later epoch fences the primary where the witness holds that epoch, and changes nothing where not;
- a join reaching a backup is ignored: only a primary admits backups;
- a shard without replicas (no witness) given a stream of a later epoch ignores it and serves on;
- only a message opening with the mark is a stream message; a primary's start is on its witness, and a second
  primary there is refused in one line."""
from __future__ import annotations

import dataclasses

import pytest

from psrv.config import ServerConfig
from psrv.protocol import Message, MsgType
from psrv.server.replication import stream
from psrv.server.replication.witness import Configuration, Witness
from psrv.server.run import Server
from psrv.transport.zmq import ZmqServer
from psrv.transport.zmq_client import ZmqClient
from tests.conformance.cluster import TIMEOUT, one_thread  # noqa: F401 (an autouse fixture)
from tests.conformance.failures import config, quiet
from tests.conformance.replica_pair import NOWHERE, QUIET_S, pair, wait_for  # noqa: F401 (pair: a fixture)
from tests.helpers import hand_driven, send_to


def test_a_primary_ignores_stray_answers_and_fences_only_an_older_stream(pair):
    primary, _, _ = pair
    epoch = primary.service.replication.epoch
    assert epoch >= 1  # its backup joined at a later epoch than its start
    line = ZmqClient([primary.address], link=True)
    try:
        for op in ("ack", "gap", "fenced"):
            line.send(0, stream.frames_of(op, epoch - 1, n=1))
            assert line.recv(QUIET_S) is None, f"a primary answered a stray {op!r}"
        line.send(0, stream.frames_of("ping", epoch, n=1))  # another primary's stream of our epoch: no answer
        assert line.recv(QUIET_S) is None, "a primary answered a stream of its own epoch"
        line.send(0, stream.frames_of("ping", epoch - 1, n=1))
        got = line.recv(TIMEOUT)
        assert got is not None and stream.read(got[1])[0] == {"op": "fenced", "epoch": epoch}, got
        assert primary.service.summary()["fenced"] is False  # a summary's JSON says false, not null
    finally:
        line.close()


@pytest.mark.parametrize("held", [True, False])
def test_a_stream_of_a_later_epoch_fences_the_primary_where_the_witness_holds_it(pair, held):
    primary, _, witness = pair
    replication = primary.service.replication
    epoch = replication.epoch
    if held:
        won, _ = Witness(witness, 0).claim(Configuration(epoch + 1, NOWHERE, (), "a takeover elsewhere"))
        assert won
    line = ZmqClient([primary.address], link=True)
    try:
        line.send(0, stream.frames_of("ping", epoch + 1, n=1))
        if held:
            wait_for("the primary was not fenced by a later epoch its witness holds", lambda: replication.replicas.fenced)
        else:
            assert line.recv(QUIET_S) is None and not replication.replicas.fenced, "fenced by an epoch no one claimed"
    finally:
        line.close()


def test_a_join_reaching_a_backup_is_ignored(pair):
    _, backup, _ = pair
    joiner = ZmqServer("tcp://127.0.0.1:0")
    line = ZmqClient([backup.address], link=True)
    try:
        line.send(0, stream.frames_of("join", backup.service.replication.epoch, address=joiner.address))
        assert joiner.recv(QUIET_S) is None, "a backup answered a join"
        assert line.recv(0) is None
    finally:
        line.close()
        joiner.close()


def test_a_shard_without_a_witness_ignores_a_stream_of_a_later_epoch_and_serves_on():
    svc, net = hand_driven(ServerConfig(workers=1, mode="async"), 8)
    net.out.clear()
    svc.handle(b"stray", stream.frames_of("ping", 5, n=1))
    assert net.out == [] and svc.replication.epoch == 0
    send_to(svc, Message(MsgType.PULL, worker=0, seq=3, clock=0))
    assert [m.type for m in net.out] == [MsgType.WEIGHTS], net.out


def test_only_a_message_opening_with_the_mark_is_a_stream_message():
    """stream.is_stream: the mark opens a replication message; no frames, or a first frame of the mark's length
    with other bytes (a worker's header may be any length), is not one."""
    assert stream.is_stream([stream.MARK, b"head"]) and stream.is_stream(stream.frames_of("ping", 0, n=0))
    assert not stream.is_stream([])
    assert not stream.is_stream([b"x" * len(stream.MARK), b"head"])
    assert not stream.is_stream([stream.MARK + b"x"])


def test_a_primarys_start_is_on_its_witness_and_a_second_primary_there_is_refused_in_one_line(pair):
    """A primary starting on a witness claims epoch 0 as "start" (psrv/server/replication/primary.py begin); a
    second primary given a witness that already holds the shard's epochs does not start, and says why."""
    primary, _, witness = pair
    assert Witness(witness, 0).read(0) == Configuration(0, primary.address, (), "start")
    cfg = quiet(config("async", replicas=1))
    with pytest.raises(ValueError) as refused:
        Server(dataclasses.replace(cfg.server_config(0, bind="tcp://127.0.0.1:0"), witness=witness)).start().join(TIMEOUT)
    latest = Witness(witness, 0).latest()
    assert str(refused.value) == (
        f"shard 0's witness {Witness(witness, 0).dir} already holds epoch {latest.epoch}, served by {primary.address}: "
        f"another primary serves this shard; start this server with --backup-of that address, or give it a fresh "
        f"--witness")
