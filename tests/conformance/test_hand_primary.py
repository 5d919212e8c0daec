"""A backup whose primary is the test's own (a ZmqServer that takes the join, and a link of the test's that streams
to the backup), so what the backup does before and as it follows is driven step by step (the reverse of
test_backup_answers.py, where the backup is the test's own):

- while its primary's state has not come, it holds a worker's request, says it still waits, and is not ready;
- once the state comes, it acknowledges the state's op, answers the held request NOT_PRIMARY naming the replicas the
  state names (or the primary it joined), says once that it is ready, and its history says whose state it took;
- a primary that refuses it without saying why ends it with its own line;
- a following backup sends a worker back to a primary heard within half the takeover bound, and holds it past that;
- a forwarded HELLO is applied with the primary's judgement of the rank holder's silence, not the backup's;
- a state it loads is said, in one line, to be the first named replica's;
- given several addresses, it asks each in turn until one answers;
- the workers its primary expired leave its active set, each with the line of its kind;
- it claims the shard once its primary is silent for the takeover bound, half a bound more for each backup named
  before it."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import time
from typing import Callable

import pytest
import torch

from psrv.history import History
from psrv.protocol import ErrorCode, Message, MsgType
from psrv.protocol.codec import decode, encode
from psrv.server.replication import follower as follower_module
from psrv.server.replication import stream
from psrv.server.run import Server
from psrv.transport.zmq import ZmqServer
from psrv.transport.zmq_client import ZmqClient
from tests.conformance.cluster import TIMEOUT, one_thread  # noqa: F401 (an autouse fixture)
from tests.conformance.failures import config, quiet
from tests.conformance.replica_pair import NOWHERE, backup_of, heartbeat, wait_for
from tests.helpers import hand_driven, hello_fields, send_to


@pytest.mark.parametrize("named", ["joined", "other", "none"])
def test_a_joining_backup_holds_a_workers_request_until_its_primarys_state_names_the_replicas(tmp_path, named,
                                                                                              monkeypatch, caplog):
    """A backup whose primary has not sent its state yet (a primary of the test's own, which takes the join and
    waits) holds a worker's request: it does not know the shard's replicas yet. Once the state comes, naming them,
    it acknowledges the state's op and answers the request NOT_PRIMARY naming those replicas
    (psrv/server/replication/follower.py hold), and its history says whose state it took and whom it follows: the
    first replica named, or the primary it joined where the state names none."""
    hand = ZmqServer("tcp://127.0.0.1:0")  # the primary's address: joins come here
    cfg = quiet(config("async", replicas=1))
    monkeypatch.setattr(follower_module, "JOIN_NOTICE", 0.3)  # it says it still waits every 0.3 s, not 10
    caplog.set_level(logging.WARNING, logger="psrv.server")
    history = History(tmp_path / "backup.jsonl")
    backup = Server(dataclasses.replace(cfg.server_config(0, bind="tcp://127.0.0.1:0"), backup_of=hand.address,
                                        witness=str(tmp_path / "witness")), history=history).start()
    replicas = {"joined": [hand.address, backup.address], "other": [NOWHERE, backup.address], "none": []}[named]
    worker = stream_to = None
    try:
        got = hand.recv(TIMEOUT)
        assert got is not None and stream.read(got[1])[0]["op"] == "join", got
        worker = heartbeat(backup)
        announced = []  # psrv serve's ready file: written once the backup follows (psrv/server/run.py serve)
        backup.service.replication.follower.on_following = lambda: announced.append(len(announced))
        assert worker.recv(1.0) is None, "a joining backup answered before it knew the shard's replicas"
        assert announced == [], "the backup said it was ready before its primary's state came"
        waiting = [r.getMessage() for r in caplog.records if "to join its primary" in r.getMessage()]
        assert waiting and re.fullmatch(rf"shard 0: this backup has waited \d+s to join its primary at "
                                        rf"{re.escape(hand.address)}; is `psrv serve` running there\?", waiting[0])
        stream_to = ZmqClient([backup.address], link=True)  # a primary streams from a link of its own
        stream_to.send(0, stream.frames_of("state", 1, n=4, **({"replicas": replicas} if replicas else {})))
        got = stream_to.recv(TIMEOUT)
        assert got is not None and stream.read(got[1])[0] == {"op": "ack", "epoch": 1, "n": 4}, got
        got = worker.recv(TIMEOUT)
        assert got is not None, "the backup never answered the request it held"
        reply = decode(got[1])
        assert (reply.type, reply.seq, reply.fields["code"], reply.fields["replicas"]) == (
            MsgType.ERROR, 1, ErrorCode.NOT_PRIMARY, replicas or [hand.address]), reply
        wait_for("the backup never said it was ready", lambda: announced)  # right after its ack, in its thread
        assert announced == [0], announced  # once
    finally:
        for line in (worker, stream_to):
            if line is not None:
                line.close()
        backup.stop()
        backup.join(TIMEOUT)
        history.close()
        hand.close()
    following = (replicas or [hand.address])[0]
    events = [json.loads(line) for line in (tmp_path / "backup.jsonl").read_text().splitlines()]
    took = [(e["from"], e["n"], e["epoch"]) for e in events if e["ev"] == "state"]
    epochs = [(e["epoch"], e["role"], e["primary"]) for e in events if e["ev"] == "epoch"]
    assert took == [(following, 4, 1)] and epochs[:1] == [(1, "backup", following)], events


def test_a_backup_its_primary_refuses_without_saying_why_ends_in_one_line(tmp_path):
    """A primary that cannot take the backup says "refused" (psrv/server/replication/primary.py join); one that says
    no more than that leaves the backup ending with the line that it was refused."""
    hand = ZmqServer("tcp://127.0.0.1:0")
    cfg = quiet(config("async", replicas=1))
    backup = Server(dataclasses.replace(cfg.server_config(0, bind="tcp://127.0.0.1:0"), backup_of=hand.address,
                                        witness=str(tmp_path / "witness"))).start()
    link = None
    try:
        got = hand.recv(TIMEOUT)
        assert got is not None and stream.read(got[1])[0]["op"] == "join", got
        link = ZmqClient([backup.address], link=True)
        link.send(0, stream.frames_of("refused", 0))
        with pytest.raises(ValueError) as refused:
            backup.join(TIMEOUT)
        assert str(refused.value) == "the primary refused this backup"
    finally:
        if link is not None:
            link.close()
        backup.stop()
        hand.close()


@contextlib.contextmanager
def following_backup(tmp_path, cfg=None, state: dict | None = None, first: str = "", before: str = "",
                     others: tuple[str, ...] = (), named: bool = True):
    """(backup, stream_to): a backup following a primary of the test's own, which sent it the state of epoch 1
    (op 4, `state` or none, naming the replicas: `first`, default the primary's address, then `others`, then the
    backup; none unless `named`) and streams to it from the link `stream_to`. `before`: an address its
    --backup-of names before the primary's."""
    hand = ZmqServer("tcp://127.0.0.1:0")
    backup = backup_of(f"{before},{hand.address}" if before else hand.address, tmp_path / "witness", cfg=cfg)
    stream_to = None
    try:
        got = hand.recv(TIMEOUT)
        assert got is not None and stream.read(got[1])[0]["op"] == "join", got
        stream_to = ZmqClient([backup.address], link=True)
        payload = [stream.state_bytes(state)] if state is not None else []
        replicas = [first or hand.address, *others, backup.address] if named else []
        stream_to.send(0, stream.frames_of("state", 1, payload, n=4, replicas=replicas))
        got = stream_to.recv(TIMEOUT)
        assert got is not None and stream.read(got[1])[0] == {"op": "ack", "epoch": 1, "n": 4}, got
        wait_for("the backup never followed", lambda: backup.service.replication.follower.following)
        yield backup, stream_to
    finally:
        if stream_to is not None:
            stream_to.close()
        backup.stop()
        backup.join(TIMEOUT)
        hand.close()


def _hello(worker: int, session: int) -> list:
    return encode(Message(MsgType.HELLO, worker=worker, seq=1, session=session,
                          fields=hello_fields(64, 2, shard=0, num_shards=1)))


def _streamed(stream_to: ZmqClient, ops: list[list]) -> None:
    """Each of `ops` (a stream message's frames) sent, then a ping: returns once the backup acknowledged them all,
    the ping last, so every op is applied."""
    for frames in ops:
        stream_to.send(0, frames)
    last = stream.read(ops[-1])[0]["n"]
    stream_to.send(0, stream.frames_of("ping", 1, n=last))
    acks = []
    while len(acks) < len(ops) + 1:
        got = stream_to.recv(TIMEOUT)
        assert got is not None, f"the backup acknowledged {acks} only"
        acks.append(stream.read(got[1])[0]["n"])
    assert acks == [stream.read(f)[0]["n"] for f in ops] + [last], acks


def held_clock(backup: Server) -> Callable[[float], None]:
    """The backup's clock, set by the test: at(x) makes it read x takeover bounds after its primary was last
    heard, and it stands still there, so nothing the case does not set comes due meanwhile."""
    heard, silence = backup.service.replication.follower.heard, backup.service.replication.timing.silence
    now = [heard]
    backup.service.state.now = lambda: now[0]

    def at(bounds: float) -> None:
        now[0] = heard + bounds * silence
    return at

def test_a_following_backup_takes_its_primary_for_live_for_half_the_takeover_bound(tmp_path):
    """A worker's request that reaches a following backup is answered NOT_PRIMARY while the primary was heard
    within half the takeover bound (`silence`), and held past that, until the primary is heard again
    (psrv/server/replication/follower.py primary_live, hold). The backup's clock is the test's: it stands still
    where the case puts it, so no takeover comes meanwhile."""
    workers = []
    with following_backup(tmp_path) as (backup, stream_to):
        at = held_clock(backup)

        def asked_at(behind: float) -> ZmqClient:
            at(behind)
            workers.append(heartbeat(backup))
            return workers[-1]

        try:
            got = asked_at(0.45).recv(TIMEOUT)  # heard 0.45 of the bound ago: live
            assert got is not None, "a backup whose primary was heard 0.45 of the takeover bound ago held the request"
            assert decode(got[1]).fields["code"] == ErrorCode.NOT_PRIMARY, decode(got[1])
            late = asked_at(0.55)  # past half the bound: the request waits for a takeover or the primary
            assert late.recv(1.0) is None, "a backup answered while its primary was silent past half the bound"
            stream_to.send(0, stream.frames_of("ping", 1, n=4))  # the primary heard again: the request goes back
            got = late.recv(TIMEOUT)
            assert got is not None and decode(got[1]).fields["code"] == ErrorCode.NOT_PRIMARY, got
        finally:
            for worker in workers:
                worker.close()


def test_a_backup_takes_a_ranks_new_process_in_as_its_primary_judged_it(tmp_path):
    """A forwarded HELLO of a rank's new process is applied with the primary's judgement of the old one's silence
    (the stream's `judged`, psrv/server/replication/follower.py on_stream), not the backup's own: the primary
    judged the holder silent long past worker_timeout, so the new session holds the rank on the backup too,
    although the backup heard the holder a moment ago."""
    with following_backup(tmp_path) as (backup, stream_to):
        sessions = backup.service.membership.sessions
        _streamed(stream_to, [stream.frames_of("req", 1, _hello(0, session), n=n, peer=b"w0", judged=judged)
                              for n, session, judged in [(5, 7, {"silent": 0.0, "heard": False}),
                                                         (6, 8, {"silent": 1e6, "heard": True})]])
        assert sessions.state_dict() == {0: 8}, "the backup judged the holder's silence itself"


def test_a_backup_given_a_state_says_it_took_the_state_of_the_first_replica_its_primary_named(tmp_path, caplog):
    """The state a following backup loads is said to be the first named replica's (psrv/server/replication/follower.py
    _take_state), in the one line a loaded state gives (here a state of a shard of the test's own that has taken a
    step, and a first replica other than the primary the backup joined)."""
    cfg = quiet(config("async", replicas=1))
    primary, _ = hand_driven(cfg.server_config(0, bind="tcp://127.0.0.1:0"), 64)
    send_to(primary, Message(MsgType.PUSH, worker=1, seq=3, clock=0, tensor=torch.ones(64)))
    caplog.set_level(logging.INFO, logger="psrv.server")
    with following_backup(tmp_path, cfg, primary.replication.replica_state(), first=NOWHERE) as (backup, _):
        assert torch.equal(backup.service.state.shard.weights, primary.state.shard.weights)
    lines = [r.getMessage() for r in caplog.records if "resumed from" in r.getMessage()]
    assert lines == [f"shard 0: resumed from primary {NOWHERE}'s state at version 1 (active workers [0, 1])"], lines


def test_a_backup_given_several_addresses_asks_each_in_turn_until_one_answers(tmp_path):
    """`--backup-of A,B`: before the witness names a primary, the backup says "join" to each address in turn
    (psrv/server/replication/follower.py _ask), so it joins B, the one that answers, although A (nothing listens
    there) comes first."""
    with following_backup(tmp_path, before=NOWHERE) as (backup, _):
        follower = backup.service.replication.follower  # it follows: the join reached the primary (B)
        assert follower.candidates == [NOWHERE, follower.primary] and follower.primary != NOWHERE, follower.candidates


@pytest.mark.parametrize("unheard", [False, True])
def test_a_backup_drops_the_workers_its_primary_expired_as_its_primary_says(tmp_path, caplog, unheard):
    """An "expire" op (the primary's workers silent past the worker timeout, or never joined: `unheard`) takes them
    out of the backup's active set and counts them lost (psrv/server/replication/follower.py on_stream), with the
    line of the kind the primary named, although the backup itself heard them a moment ago."""
    caplog.set_level(logging.WARNING, logger="psrv.server")
    with following_backup(tmp_path) as (backup, stream_to):
        state = backup.service.state
        _streamed(stream_to, [stream.frames_of("req", 1, _hello(w, 70 + w), n=5 + w, peer=b"w%d" % w,
                                               judged={"silent": 0.0, "heard": False}) for w in (0, 1)])
        assert set(state.controller.active) == {0, 1}
        _streamed(stream_to, [stream.frames_of("expire", 1, n=7, workers=[1], unheard=[1] if unheard else [])])
        assert (set(state.controller.active), state.stats.lost_workers) == ({0}, [1])
    lines = [r.getMessage() for r in caplog.records]
    silent = [line for line in lines if "worker 1 silent for" in line]
    never = [line for line in lines if "never joined" in line]
    assert (len(silent), len(never)) == ((0, 1) if unheard else (1, 0)), lines


@pytest.mark.parametrize("named, bound", [("none", 1.0), ("first", 1.0), ("second", 1.5)])
def test_a_backup_claims_the_shard_once_its_primary_is_silent_for_its_place_among_the_backups(tmp_path, caplog,
                                                                                             named, bound):
    """A following backup tries to take the shard over once its primary was silent for the takeover bound, the
    first backup its primary names at once, each later one half a bound after the one before, so the first claims
    first (psrv/server/replication/follower.py tick, _bound); a state that names no replicas makes it the first.
    The backup's clock is the test's; its witness holds no configuration (the primary is the test's), so its try is
    the line that says so."""
    caplog.set_level(logging.ERROR, logger="psrv.server")
    others, named_any = ((NOWHERE,) if named == "second" else ()), named != "none"
    with following_backup(tmp_path, others=others, named=named_any) as (backup, _):
        at = held_clock(backup)

        def tried() -> bool:
            return any("holds no configuration" in r.getMessage() for r in caplog.records)

        at(bound - 0.1)
        time.sleep(0.5)  # turns of its loop (50 ms each) at a clock short of its bound
        assert not tried(), f"the backup claimed the shard {bound - 0.1:g} bounds after its primary fell silent"
        at(bound + 0.1)
        wait_for(f"the backup never claimed the shard {bound + 0.1:g} bounds after its primary fell silent", tried)

