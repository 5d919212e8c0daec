"""A primary whose loop stalls past the takeover bound and then goes on (psrv/server/replication/primary.py
fence): its backup takes the shard at the next epoch; the primary, back, pings it, hears "fenced", and stops
acknowledging. What it does then is read back from the servers themselves, not from a run that happened to end:

- it records the fencing in its history (the epoch and who fenced it) and says so in one line;
- it stops serving (the shard's state says stopped), but first lingers, answering a worker's request with
  NOT_PRIMARY naming the replica the witness gives the shard now, so that a worker that knew of no other
  replica finds it (docs/reliability.md, "Fencing")."""
from __future__ import annotations

import threading
import time

from psrv.protocol import ErrorCode, Message, MsgType
from psrv.protocol.codec import decode, encode
from psrv.transport.zmq_client import ZmqClient
from tests.conformance.cluster import TIMEOUT, one_thread  # noqa: F401 (one_thread: an autouse fixture)
from tests.conformance.failures import config
from tests.conformance.replica_pair import follower, history_of, serving_pair, wait_for, worker_answer

STALL_S = 3.0  # past the 1 s takeover bound of failures.py's FAILURE_BOUND, with 2 s to spare


def stall_once(server, seconds: float) -> threading.Event:
    """The next turn of `server`'s loop stops for `seconds` (a SIGSTOP'd or starved process) before its replicas'
    tick; the event is set once it goes on."""
    replicas = server.service.replication.replicas
    tick, back = replicas.tick, threading.Event()

    def stalling() -> None:
        if not back.is_set():
            time.sleep(seconds)
            back.set()
        tick()
    replicas.tick = stalling
    return back


def test_a_primary_back_from_a_stall_is_fenced_lingers_answering_not_primary_then_stops(tmp_path, caplog):
    with serving_pair(config("async", replicas=1), str(tmp_path / "witness"), str(tmp_path)) as (primary, backup):
        replicas = primary.service.replication.replicas
        epoch = replicas.epoch
        back = stall_once(primary, STALL_S)
        wait_for("the backup never took over", lambda: follower(backup) is None)
        assert backup.service.replication.epoch == epoch + 1
        wait_for("the primary never came back", back.is_set)
        # fence() sets fenced, then its linger, then stopped: wait for the last (any value but False)
        wait_for("the primary, back, was never fenced",
                 lambda: replicas.fenced and primary.service.state.stopped is not False)
        assert primary.service.state.stopped is True  # it ends, once its linger is over
        assert replicas.linger_until - primary.service.state.now() > replicas.s.timing.fenced_linger - STALL_S
        stats = ZmqClient([primary.address])  # psrv top's STATS in the linger: answered as ever, and it lingers on
        try:
            stats.send(0, encode(Message(MsgType.STATS, worker=0, seq=5)))
            got = stats.recv(TIMEOUT)
            again = stats.recv(0.3)  # one request, one answer: no NOT_PRIMARY after it
        finally:
            stats.close()
        assert got is not None and again is None, (got, again)
        answer_to_stats = decode(got[1])
        assert (answer_to_stats.type, answer_to_stats.seq) == (MsgType.STATS, 5) and answer_to_stats.fields["fenced"]
        reply = worker_answer(primary, "the fenced primary, in its linger,")  # sent on to the shard's primary now
        assert (reply.type, reply.seq, reply.fields["code"], reply.fields["replicas"]) == (
            MsgType.ERROR, 1, ErrorCode.NOT_PRIMARY, [backup.address]), reply
        assert reply.fields["message"] == (f"shard 0: this replica ({primary.address}) is fenced; the shard is served "
                                           f"by {backup.address}"), reply
        # a witness it cannot read (its shard's folder a file for a moment): NOT_PRIMARY naming no replica
        folder = tmp_path / "witness" / "shard-0"
        folder.rename(tmp_path / "witness-aside")
        folder.write_text("not a folder")
        try:
            reply = worker_answer(primary, "the fenced primary, its witness unreadable,")
        finally:
            folder.unlink()
            (tmp_path / "witness-aside").rename(folder)
        assert (reply.fields["code"], reply.fields["replicas"]) == (ErrorCode.NOT_PRIMARY, []), reply
        assert reply.fields["message"].endswith("is fenced; the shard is served by no replica the witness names")
        assert primary.service.state.now() < replicas.linger_until, "the linger ended before the last answer"
        assert primary.service.state.stopped is True and replicas.fenced
        [fenced] = [e for e in history_of(primary) if e["ev"] == "fenced"]
        assert (fenced["epoch"], fenced["by"]) == (epoch + 1, backup.address), fenced
        assert [r.getMessage() for r in caplog.records if "this primary stops" in r.getMessage()] == [
            f"shard 0: {backup.address} took this shard over at epoch {epoch + 1} (this primary's is {epoch}); "
            f"this primary stops without answering"]
