"""What a following backup does with stream messages no correct primary of its configuration sends
(psrv/server/replication/follower.py on_stream, handler.py on_stream): each is sent by hand, from a line of
its own, to a backup that follows a real primary (psrv.Server threads on 127.0.0.1 with a witness, as the
failure cases run them), and the backup's answer, epoch, place in the stream and log line are read back.

- an op of a later epoch that the witness does not give to its primary with this backup is ignored, unanswered:
  no epoch, no configuration the witness holds, another primary's, one without this backup;
- an op of an earlier epoch is answered "fenced" with the backup's own epoch (a paused primary that comes back);
- an op out of order (not the next number) is answered "gap", and the backup asks for the state again;
- a message that is not one (a header that does not decode, or lacks op or epoch) is ignored, with a line;
- and a worker's request to it is answered NOT_PRIMARY naming the replicas its primary's state named."""
from __future__ import annotations

import logging
import pickle
import time
from pathlib import Path

import pytest
import torch

from psrv.config import ServerConfig
from psrv.protocol import ErrorCode, Message, MsgType
from psrv.protocol.codec import decode, encode
from psrv.server.replication import stream
from psrv.server.replication.witness import Configuration, Witness
from psrv.transport.zmq_client import ZmqClient
from tests.conformance.cluster import TIMEOUT, one_thread  # noqa: F401 (an autouse fixture)
from tests.conformance.replica_pair import (QUIET_S, answer, follower, history_of, line, pair,  # noqa: F401
                                            said, worker_answer)
from tests.helpers import hand_driven, hello_fields
from tests.helpers import send_to as send

@pytest.mark.parametrize("claimed", ["nothing", "another primary", "without this backup"])
def test_an_op_of_a_later_epoch_the_witness_does_not_confirm_is_ignored(pair, line, caplog, claimed):
    primary, backup, witness = pair
    f = follower(backup)
    expected, epoch = f.expected, backup.service.replication.epoch
    later = epoch + 1
    if claimed != "nothing":  # the witness holds a configuration at that epoch that does not give us the op
        who = "tcp://127.0.0.1:1" if claimed == "another primary" else primary.address
        backups = (backup.address,) if claimed == "another primary" else ()
        won, _ = Witness(witness, 0).claim(Configuration(later, who, backups, "a test's claim"))
        assert won
    line.send(0, stream.frames_of("ping", later, n=expected - 1))
    assert answer(line, QUIET_S) is None, "an unconfirmed op was answered"
    assert (backup.service.replication.epoch, f.expected, f.following) == (epoch, expected, True)
    assert all(e["epoch"] < later for e in history_of(backup) if e["ev"] == "epoch")
    assert said(caplog, f"shard 0: a stream op at epoch {later} that the witness does not give to {primary.address} "
                        f"with this backup; ignored")


def test_a_later_epoch_the_witness_gives_to_the_primary_with_this_backup_is_followed(pair, line):
    """The counterpart: a configuration the primary claimed (a backup added or dropped) moves the backup along."""
    primary, backup, witness = pair
    f = follower(backup)
    later = backup.service.replication.epoch + 1
    assert Witness(witness, 0).claim(Configuration(later, primary.address, (backup.address,), "a test's claim"))[0]
    line.send(0, stream.frames_of("ping", later, n=f.expected - 1))
    assert answer(line) == {"op": "ack", "epoch": later, "n": f.expected - 1}
    assert backup.service.replication.epoch == later
    [event] = [e for e in history_of(backup) if e["ev"] == "epoch" and e["epoch"] == later]
    assert {k: event[k] for k in ("role", "primary")} == {"role": "backup", "primary": primary.address}, event


def test_an_op_of_an_earlier_epoch_is_answered_fenced(pair, line):
    _, backup, _ = pair
    epoch = backup.service.replication.epoch
    assert epoch >= 1
    line.send(0, stream.frames_of("ping", epoch - 1, n=0))
    assert answer(line) == {"op": "fenced", "epoch": epoch}


def test_an_op_without_its_number_is_answered_gap_naming_none(pair, line):
    """An op whose header has no `n` cannot be the next: "gap", with n null, and the backup asks for the state."""
    _, backup, _ = pair
    line.send(0, stream.frames_of("req", backup.service.replication.epoch))
    assert answer(line) == {"op": "gap", "epoch": backup.service.replication.epoch, "n": None}


def test_an_op_out_of_order_is_answered_gap_and_the_backup_asks_for_the_state_again(pair, line, caplog):
    primary, backup, _ = pair
    f = follower(backup)
    expected, epoch = f.expected, backup.service.replication.epoch
    admitted = primary.service.replication.replicas.admitted
    line.send(0, stream.frames_of("req", epoch, n=expected + 5))
    assert answer(line) == {"op": "gap", "epoch": epoch, "n": expected + 5}
    assert said(caplog, f"shard 0: op {expected + 5} came, op {expected} expected; asking for the state again")
    deadline = time.monotonic() + TIMEOUT  # it joins again, and its primary sends the state at a new epoch
    while primary.service.replication.replicas.admitted == admitted or not f.following:
        assert time.monotonic() < deadline, "the backup never followed again"
        time.sleep(0.01)
    assert backup.service.replication.epoch == epoch + 1


@pytest.mark.parametrize("frames,why", [
    ([stream.MARK], "not a replication stream message"),
    ([stream.MARK, b"\x93\x01"], None),  # msgpack's own words
    ([stream.MARK, stream.frames_of("ping", 1)[1][:-1]], None),
    ([stream.MARK, b"\x81\xa2op\xa4ping"], "a replication header without op and epoch: {'op': 'ping'}"),
])
def test_a_malformed_stream_message_is_ignored_with_a_line(pair, line, caplog, frames, why):
    caplog.set_level(logging.WARNING, logger="psrv.server")
    _, backup, _ = pair
    f = follower(backup)
    expected = f.expected
    line.send(0, frames)
    assert answer(line, QUIET_S) is None
    assert f.expected == expected and f.following
    lines = [r.getMessage() for r in caplog.records if r.name == "psrv.server"]
    prefix = "shard 0: ignored a malformed replication message: "
    assert any(m.startswith(prefix) and (why is None or m == prefix + why) for m in lines), lines


def test_a_workers_request_to_a_following_backup_is_sent_to_the_replicas_its_primary_named(pair):
    """A backup answers NOT_PRIMARY naming the shard's replicas as its primary's state said them: the primary,
    then its backups (so a worker finds the shard's next primary too)."""
    primary, backup, _ = pair
    reply = worker_answer(backup, "the backup")
    assert (reply.type, reply.seq, reply.fields["code"], reply.fields["replicas"]) == (
        MsgType.ERROR, 1, ErrorCode.NOT_PRIMARY, [primary.address, backup.address]), reply
    assert reply.fields["message"] == (f"shard 0: this replica ({backup.address}) is a backup; the shard is served by "
                                       f"{primary.address}"), reply


def test_a_state_frame_holding_more_than_tensors_and_plain_data_is_refused():
    """stream.state_from reads a "state" op's frame with torch.load's weights_only: tensors, numbers, strings and
    containers come back, an object of any other class (whose unpickling could run code) is refused."""
    state = {"weights": torch.arange(4.0), "clock": 3, "who": ["a", "b"], "table": {"1": (2, 3.5)}}
    back = stream.state_from(stream.state_bytes(state))
    assert torch.equal(back["weights"], state["weights"]) and {k: back[k] for k in ("clock", "who", "table")} == {
        "clock": 3, "who": ["a", "b"], "table": {"1": (2, 3.5)}}
    with pytest.raises(pickle.UnpicklingError):
        stream.state_from(stream.state_bytes({"weights": torch.zeros(2), "hook": _NotState()}))


class _NotState:
    """Any class outside torch.load's weights_only allowlist."""


def _two_workers_pull_and_leave(primary) -> Message:
    """Two workers of our own say HELLO to `primary`, rank 0 sends INIT, rank 1 pulls, both leave: rank 1's
    answer."""
    workers = [ZmqClient([primary.address]) for _ in range(2)]

    def ask(w: int, msg: Message) -> Message:
        workers[w].send(0, encode(msg))
        got = workers[w].recv(TIMEOUT)
        assert got is not None, f"no answer to {msg.type.name}"
        return decode(got[1])

    try:
        for w in (0, 1):
            assert ask(w, Message(MsgType.HELLO, worker=w, seq=1, session=7,
                                  fields=hello_fields(10, 2))).type is MsgType.WELCOME
        assert ask(0, Message(MsgType.INIT, worker=0, seq=2, session=7, tensor=torch.zeros(10))).type is MsgType.OK
        weights = ask(1, Message(MsgType.PULL, worker=1, seq=2, session=7, clock=0))
        for w in (0, 1):
            assert ask(w, Message(MsgType.LEAVE, worker=w, seq=3, session=7)).type is MsgType.OK
        return weights
    finally:
        for c in workers:
            c.close()


def test_a_replicated_shards_answers_name_its_replicas_and_its_end_is_on_the_witness(pair):
    """Every answer of a primary with a witness says its epoch and the replicas that serve the shard (a worker
    follows the shard through failovers by them: psrv/client/roundtrip.py). Once every worker has left, the witness
    holds the shard's last configuration: the next epoch, served by no replica (a backup that comes back ends)."""
    primary, backup, witness = pair
    epoch = primary.service.replication.epoch
    weights = _two_workers_pull_and_leave(primary)
    assert weights.type is MsgType.WEIGHTS and (weights.fields["epoch"], weights.fields["replicas"]) == (
        epoch, [primary.address, backup.address]), weights
    primary.join(TIMEOUT)
    last = Witness(witness, 0).latest()
    assert last == Configuration(epoch + 1, "", (), "finished: every worker left") and last.finished, last


def test_a_shard_whose_witness_cannot_take_its_end_still_ends_and_says_so(pair, caplog, tmp_path):
    """The last configuration cannot be written (the shard's witness folder gone, a file in its place): the shard
    ends all the same, and says in one line what it could not do."""
    primary, _, witness = pair
    folder = Path(witness) / "shard-0"
    folder.rename(tmp_path / "witness-aside")
    folder.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="psrv.server"):
        _two_workers_pull_and_leave(primary)
        primary.join(TIMEOUT)
    lines = [r.getMessage() for r in caplog.records if "could not say on the witness" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "shard 0: could not say on the witness that the shard finished ("), lines
    assert "[Errno" in lines[0] and lines[0].endswith(")"), lines  # the OS's own words for what failed


def test_a_configuration_file_with_only_its_epoch_and_primary_reads_with_no_backups_reason_or_time(tmp_path):
    """A witness file written with the two fields that decide who serves (as a person pointing a shard at one of
    its replicas would write it) reads as the configuration those two make: no backups, no reason, time 0
    (psrv/server/replication/witness.py read), not a refusal to read it."""
    witness = Witness(tmp_path, 0)
    (witness.dir / "epoch-3.json").write_text('{"epoch": 3, "primary": "tcp://127.0.0.1:9"}')
    got = witness.read(3)
    assert got == Configuration(3, "tcp://127.0.0.1:9") and (got.backups, got.why, got.at) == ((), "", 0.0), got
    assert witness.latest() == got


def test_a_primarys_history_says_each_epoch_it_serves_with_its_backups(pair):
    """A primary records each configuration it serves (psrv/server/replication/primary.py serve_as): its start,
    alone, then the epoch that added its backup, each with the primary and the backups the witness holds for it
    (docs/history.md: the history checker reads one primary per epoch from them)."""
    primary, backup, witness = pair
    epochs = [e for e in history_of(primary) if e["ev"] == "epoch"]
    held = [Witness(witness, 0).read(e["epoch"]) for e in epochs]
    assert [(e["epoch"], e["role"], e["primary"], e["backups"]) for e in epochs] == [
        (c.epoch, "primary", c.primary, list(c.backups)) for c in held], (epochs, held)
    assert [(e["primary"], e["backups"]) for e in epochs][-1] == (primary.address, [backup.address]), epochs
    assert epochs[0]["backups"] == [] and epochs[0]["epoch"] == 0, epochs


def test_a_shard_without_replication_answers_at_epoch_0_and_names_no_replicas():
    """A shard with no witness serves epoch 0 (psrv/server/replication/handler.py `epoch`): its push and pull
    answers say so, as the workers' histories record it (psrv/client/roundtrip.py), and name no replicas."""
    svc, net = hand_driven(ServerConfig(workers=1, mode="async"), 8)
    net.out.clear()
    send(svc, Message(MsgType.PUSH, worker=0, seq=3, clock=0, tensor=torch.ones(8)))
    send(svc, Message(MsgType.PULL, worker=0, seq=4, clock=1))
    assert [m.type for m in net.out] == [MsgType.OK, MsgType.WEIGHTS], net.out
    assert [(m.fields["epoch"], "replicas" in m.fields) for m in net.out] == [(0, False), (0, False)], net.out
