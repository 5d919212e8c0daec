"""What a primary does with its backup's answers and silence (psrv/server/replication/primary.py `_answer`,
`_await`, `_drop`, `_admit`): the backup here is a line of our own, a psrv ZmqServer that joins a real primary (a
psrv.Server thread on 127.0.0.1 with a witness) as a backup does and then answers by hand, so the answers a correct
backup never sends can be sent, at a moment the case chooses.

- a malformed answer, or an ack naming no op, is no ack: the reply the primary holds for the backup's ack still
  waits for it;
- a "gap" answer (the backup missed an op) drops the backup at a new epoch, and the primary sends it the state
  again at the next one, unasked (the backup also asks by itself: here it does not);
- a gap the witness cannot record (its shard folder a file, as test_witness_faults.py breaks it) drops nothing,
  and the held reply still waits for the backup's ack;
- a join is said in one line (its op, epoch and the shard's version);
- a join said before the backup was added (of an earlier epoch) changes nothing;
- a join the witness cannot take (a second backup that asks once) is kept, and admitted once it can;
- a backup silent past the ack timeout is dropped at a new epoch, saying why in the witness and in one line;
- a backup silent past the ack timeout while the witness cannot take its drop stays, nothing is acknowledged
  without it, the claim is tried again every RETRY_CLAIM (one line each), and its ack, when it comes, releases
  the held reply;
- a gap whose drop another replica's claim beats fences the primary, which stops waiting at once: the next
  request is answered NOT_PRIMARY, not after the ack timeout;
- an op the backup acknowledged before a reply waits for it is not waited for again;
- a backup whose process ended (its sockets closed) is dropped once its link stays broken, with that reason,
  not after the ack timeout's silence; one whose link breaks and comes back within LINK_SETTLE is kept.

BOUND makes the ack timeout 12 s: a case that would pass only by waiting it out reads its answer within half."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path

import pytest

from psrv.protocol import ErrorCode, MsgType
from psrv.server.replication import primary as primary_module
from psrv.server.replication import stream
from psrv.server.replication.primary import RETRY_CLAIM
from psrv.server.replication.witness import Configuration, Witness
from psrv.server.run import Server
from psrv.transport.zmq import ZmqServer
from psrv.transport.zmq_client import ZmqClient
from tests.conformance.cluster import TIMEOUT, one_thread  # noqa: F401 (an autouse fixture)
from tests.conformance.failures import config
from tests.conformance.replica_pair import QUIET_S, heartbeat, wait_for, worker_answer

# the failure bound: a backup silent on an op is dropped after this long (the ack timeout), so a case's own pause
# between two answers, on a loaded machine, is not taken for a silent backup (the highest bound the worker
# timeout of failures.py allows: psrv/timeouts.py check)
BOUND = 12.0


class HandBackup:
    """A backup's two lines: the address the primary streams to (a ZmqServer, as a backup's shard has) and a link
    to the primary to say "join" on (a backup's follower link)."""

    def __init__(self, primary: Server):
        self.server = ZmqServer("tcp://127.0.0.1:0")
        self.address = self.server.address
        self.to_primary = ZmqClient([primary.address], link=True)
        self.peer = None  # the primary's stream link, once it sent something

    def join(self) -> None:
        self.to_primary.send(0, stream.frames_of("join", 0, address=self.address))

    def next_op(self, op: str, timeout: float = TIMEOUT) -> dict:
        """The header of the next stream message `op` the primary sends (pings skipped)."""
        while True:
            got = self.server.recv(timeout)
            assert got is not None, f"the primary sent no {op!r} within {timeout:g}s"
            self.peer, frames = got
            head, _ = stream.read(frames)
            if head["op"] == op:
                return head
            assert head["op"] == "ping", head

    def say(self, frames: list) -> None:
        self.server.send(self.peer, frames)

    def close(self) -> None:
        """Close both lines (again: nothing), as a process that ends closes its sockets."""
        if self.server is not None:
            self.to_primary.close()
            self.server.close()
            self.server = None


@contextlib.contextmanager
def hand_joined(witness: Path, bound: float):
    """(primary, hand backup, its state's header): shard 0's primary with a witness at `witness` and the failure
    bound `bound`, the hand backup joined and sent the state, not yet acknowledged; both stopped at the end."""
    cfg = config("async", replicas=1, failure_bound=bound)
    primary = Server(dataclasses.replace(cfg.server_config(0, bind="tcp://127.0.0.1:0"), witness=str(witness))).start()
    backup = HandBackup(primary)
    try:
        backup.join()
        state = backup.next_op("state")
        # the primary counts the backup in once it sent the state: after it (admitted is its last word)
        wait_for("the primary never counted the state sent", lambda: primary.service.replication.replicas.admitted)
        yield primary, backup, state
    finally:
        backup.close()
        primary.stop()
        primary.join(TIMEOUT)


@contextlib.contextmanager
def held_reply(primary: Server):
    """A worker's request whose reply `primary` holds, waiting for its backup's ack: the worker to read the reply
    from once the primary is in that wait; closed at the end."""
    replicas = primary.service.replication.replicas
    worker = heartbeat(primary)
    try:
        wait_for("the primary never waited for the state's ack", lambda: replicas.unacked is None)
        yield worker
    finally:
        worker.close()


@pytest.fixture
def joined(tmp_path):
    with hand_joined(tmp_path / "witness", BOUND) as got:
        yield got


def test_a_malformed_answer_is_no_ack_and_the_held_reply_waits_for_the_real_one(joined):
    primary, backup, state = joined
    replicas = primary.service.replication.replicas
    assert replicas.unacked == state["n"]
    with held_reply(primary) as worker:  # its reply waits until the backup holds every op sent: the state
        backup.say([stream.MARK, b"\x93\x01\x02\x03"])  # msgpack, but no header: stream.read refuses it
        backup.say(stream.frames_of("ack", state["epoch"]))  # an ack that names no op acknowledges none
        assert worker.recv(QUIET_S) is None, "a malformed answer released the reply held for the backup's ack"
        backup.say(stream.frames_of("ack", state["epoch"], n=state["n"]))
        assert worker.recv(TIMEOUT) is not None, "the backup's ack did not release the held reply"
        assert [b.address for b in replicas.backups] == [backup.address]
        assert primary.service.replication.epoch == state["epoch"]


def test_a_gap_drops_the_backup_and_the_primary_sends_it_the_state_again_unasked(joined, tmp_path):
    primary, backup, state = joined
    backup.say(stream.frames_of("ack", state["epoch"], n=state["n"]))
    backup.say(stream.frames_of("gap", state["epoch"], n=state["n"] + 1))
    again = backup.next_op("state")  # no "join" said since the first
    witness = Witness(str(tmp_path / "witness"), 0)
    dropped = witness.read(state["epoch"] + 1)
    assert (dropped.primary, dropped.backups) == (primary.address, ())
    assert dropped.why == f"drop {backup.address}: it missed op {state['n'] + 1}"
    assert again["epoch"] == state["epoch"] + 2
    assert (witness.latest().backups, witness.latest().why) == ((backup.address,), f"join {backup.address}")


def test_a_gap_the_witness_cannot_record_keeps_the_backup_and_the_held_reply_waits_for_its_ack(joined, tmp_path):
    primary, backup, state = joined
    replicas = primary.service.replication.replicas
    shard = Path(tmp_path / "witness" / "shard-0")
    away = shard.with_name("shard-0.away")
    with held_reply(primary) as worker:
        shard.rename(away)
        shard.write_text("not a folder")
        backup.say(stream.frames_of("gap", state["epoch"], n=state["n"] + 1))
        assert worker.recv(QUIET_S) is None, "a gap the witness could not record released the held reply"
        assert [b.address for b in replicas.backups] == [backup.address]
        assert primary.service.replication.epoch == state["epoch"] and not replicas.fenced
        shard.unlink()
        away.rename(shard)
        backup.say(stream.frames_of("ack", state["epoch"], n=state["n"]))
        assert worker.recv(TIMEOUT) is not None, "the backup's ack did not release the held reply"


def test_a_gap_whose_drop_another_claim_beats_fences_the_primary_which_stops_waiting_at_once(joined, tmp_path):
    primary, backup, state = joined
    replicas = primary.service.replication.replicas
    with held_reply(primary) as worker:
        other = "tcp://127.0.0.1:1"
        assert Witness(str(tmp_path / "witness"), 0).claim(
            Configuration(state["epoch"] + 1, other, (), "a test's claim"))[0]
        backup.say(stream.frames_of("gap", state["epoch"], n=state["n"] + 1))
        wait_for("the primary was never fenced", lambda: replicas.fenced)
        # the fenced primary's linger answers it, once it is out of the wait
        reply = worker_answer(primary, "the fenced primary, still waiting for the backup's ack,", BOUND / 2)
        assert (reply.type, reply.fields["code"]) == (MsgType.ERROR, ErrorCode.NOT_PRIMARY), reply
        assert worker.recv(QUIET_S) is None, "a fenced primary sent the reply it held"


def test_an_op_the_backup_acknowledged_before_a_reply_waits_is_not_waited_for_again(joined):
    primary, backup, state = joined
    replicas = primary.service.replication.replicas
    backup.say(stream.frames_of("ack", state["epoch"], n=state["n"]))
    wait_for("the primary never read the ack", lambda: replicas.backups[0].acked == state["n"])
    assert replicas.unacked == state["n"]  # no reply has waited for it yet
    worker = heartbeat(primary)  # the backup here answers nothing more, not even a ping
    try:
        assert worker.recv(BOUND / 2) is not None, "the reply waited for an ack the backup had already given"
        assert [b.address for b in replicas.backups] == [backup.address]
    finally:
        worker.close()


def test_a_backup_whose_process_ended_is_dropped_for_its_broken_link_not_its_silence(joined, tmp_path):
    primary, backup, state = joined
    replicas = primary.service.replication.replicas
    with held_reply(primary) as worker:
        backup.close()
        assert worker.recv(BOUND / 2) is not None, "the backup's end was seen only at the ack timeout"
        assert replicas.backups == []
    dropped = Witness(str(tmp_path / "witness"), 0).read(state["epoch"] + 1)
    assert (dropped.primary, dropped.backups) == (primary.address, ())
    assert dropped.why == f"drop {backup.address}: its connection broke (its process ended)"


def test_a_backup_whose_link_breaks_and_comes_back_within_the_settle_is_kept(joined, monkeypatch):
    primary, backup, state = joined
    monkeypatch.setattr(primary_module, "LINK_SETTLE", 4.0)  # the time to come back, under BOUND / 2
    replicas = primary.service.replication.replicas
    with held_reply(primary) as worker:
        backup.server.close()  # the connection breaks; the same address listens again at once
        backup.server = ZmqServer(backup.address)
        backup.next_op("ping")  # the primary's link came back: its next ping reaches the new socket
        assert worker.recv(0) is None and [b.address for b in replicas.backups] == [backup.address], \
            "a backup was dropped for a link that came back"
        backup.say(stream.frames_of("ack", state["epoch"], n=state["n"]))
        assert worker.recv(TIMEOUT) is not None, "the backup's ack did not release the held reply"
        assert [b.address for b in replicas.backups] == [backup.address]
        assert primary.service.replication.epoch == state["epoch"]


def test_a_silent_backup_whose_drop_the_witness_cannot_take_is_kept_and_its_late_ack_releases_the_reply(
        tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="psrv.server")
    bound = 3.0  # the ack timeout: the witness is made to fail well before it, then the case waits it out
    with hand_joined(tmp_path / "witness", bound) as (primary, backup, state):
        replicas = primary.service.replication.replicas
        tried = f"shard 0: could not claim epoch {state['epoch'] + 1} on the witness"

        def claims() -> int:
            return sum(r.getMessage().startswith(tried) for r in caplog.records)

        shard = tmp_path / "witness" / "shard-0"
        away = shard.with_name("shard-0.away")
        try:
            with held_reply(primary) as worker:
                shard.rename(away)
                shard.write_text("not a folder")
                broke = time.monotonic()
                wait_for("the primary never tried the silent backup's drop again", lambda: claims() >= 2)
                tries, waited = claims(), time.monotonic() - broke
                assert worker.recv(0) is None, "a reply left without the silent backup's ack or its drop"
                assert [b.address for b in replicas.backups] == [backup.address] and not replicas.fenced
                assert tries <= waited / RETRY_CLAIM + 1, (tries, waited)  # every RETRY_CLAIM, no faster
                backup.say(stream.frames_of("ack", state["epoch"], n=state["n"]))  # the witness still out of reach
                assert worker.recv(TIMEOUT) is not None, "the backup's late ack did not release the held reply"
                assert [b.address for b in replicas.backups] == [backup.address]
                assert primary.service.replication.epoch == state["epoch"]
        finally:
            if shard.is_file():
                shard.unlink()
                away.rename(shard)


def test_a_backup_silent_past_the_ack_timeout_is_dropped_saying_why(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="psrv.server")
    with hand_joined(tmp_path / "witness", 1.0) as (primary, backup, state):
        replicas = primary.service.replication.replicas
        worker_answer(primary, "the primary, its held reply not released by the silent backup's drop,")
        assert replicas.backups == []
        why = f"no ack of op {state['n']} within 1s"
        dropped = Witness(str(tmp_path / "witness"), 0).read(state["epoch"] + 1)
        assert (dropped.primary, dropped.backups, dropped.why) == (primary.address, (), f"drop {backup.address}: {why}")
        assert [r.getMessage() for r in caplog.records if "dropping it" in r.getMessage()] == [
            f"shard 0: backup {backup.address}: {why}; dropping it at the next epoch"]


def test_a_join_the_witness_cannot_take_is_kept_and_admitted_once_it_can_without_being_asked_again(joined, tmp_path,
                                                                                                  caplog):
    primary, first, state = joined
    replicas = primary.service.replication.replicas
    first.say(stream.frames_of("ack", state["epoch"], n=state["n"]))
    shard = tmp_path / "witness" / "shard-0"
    away = shard.with_name("shard-0.away")
    second = HandBackup(primary)
    try:
        shard.rename(away)
        shard.write_text("not a folder")
        second.join()  # once: a real backup asks every JOIN_EVERY, this one never again
        tried = f"shard 0: could not claim epoch {state['epoch'] + 1} on the witness"
        wait_for("the primary never tried to add the joiner",
                 lambda: any(r.getMessage().startswith(tried) for r in caplog.records))
        wait_for("the joiner the witness could not take was forgotten", lambda: replicas.joining == [second.address])
        assert len(replicas.backups) == 1
        shard.unlink()
        away.rename(shard)
        got = second.next_op("state")
        assert got["epoch"] == state["epoch"] + 1
        latest = Witness(str(tmp_path / "witness"), 0).latest()
        assert (latest.backups, latest.why) == ((first.address, second.address), f"join {second.address}")
    finally:
        second.close()
        if shard.is_file():
            shard.unlink()
            away.rename(shard)


def test_a_join_said_before_the_backup_was_added_changes_nothing(joined, tmp_path):
    """A "join" of an epoch before the one the backup was added at was said before it was added (queued, or
    crossing its state): the primary neither adds it again nor sends it the state again."""
    primary, backup, state = joined
    replicas = primary.service.replication.replicas
    backup.say(stream.frames_of("ack", state["epoch"], n=state["n"]))
    assert state["epoch"] >= 1
    backup.join()  # epoch 0, as its first
    deadline = time.monotonic() + QUIET_S
    while (got := backup.server.recv(max(0.0, deadline - time.monotonic()))) is not None:
        assert stream.read(got[1])[0]["op"] == "ping", "a stale join was sent the state again"
    assert replicas.admitted == 1 and [b.address for b in replicas.backups] == [backup.address]
    assert Witness(str(tmp_path / "witness"), 0).latest().epoch == state["epoch"]


def test_a_join_is_said_in_one_line_with_its_op_epoch_and_the_shards_version(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="psrv.server")
    with hand_joined(tmp_path / "witness", BOUND) as (primary, backup, state):
        lines = [r.getMessage() for r in caplog.records if r.name == "psrv.server" and "joined at op" in r.getMessage()]
    # a shard with no state yet (no worker's INIT): version 0
    assert lines == [f"shard 0: backup {backup.address} joined at op {state['n']} (epoch {state['epoch']}, version 0)"]


def test_an_idle_primary_pings_its_backup_once_each_ping_every_naming_its_last_op(joined):
    """A primary whose stream is quiet pings each backup every ping_every (F/10), no oftener, each ping naming the
    last op sent (psrv/server/replication/primary.py _ping): here the state's, acknowledged, and nothing since."""
    primary, backup, state = joined
    backup.say(stream.frames_of("ack", state["epoch"], n=state["n"]))
    every = primary.service.replication.timing.ping_every
    pings, until = [], time.monotonic() + 2.5 * every
    while time.monotonic() < until:
        got = backup.server.recv(max(0.0, until - time.monotonic()))
        if got is not None:
            pings.append((time.monotonic(), stream.read(got[1])[0]))
    assert [head for _, head in pings] == [{"op": "ping", "epoch": state["epoch"], "n": state["n"]}] * len(pings)
    assert 1 <= len(pings) <= 3, pings  # 2.5 intervals: at most one at each of their ends, and one at the start
    gaps = [b - a for (a, _), (b, _) in zip(pings, pings[1:])]
    assert all(gap >= 0.5 * every for gap in gaps), (every, gaps)  # half: a ping read late narrows the next gap
