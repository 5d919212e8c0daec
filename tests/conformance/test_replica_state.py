"""A joining backup's state (psrv/server/replication/handler.py replica_state and load_replica_state): what its
primary sends it, through torch.save's bytes as the stream carries it, loaded into a fresh shard, gives that shard
the primary's state leaf by leaf (weights, optimizer, clocks, the workers' compressed-pull copies, the pulls waiting
for their answer, the counters, who holds each rank, the workers' step speeds, the workers that sent their final
pull), says in one line whose state it took, and leaves it a backup's, not a resumed checkpoint's. A ShardService
driven by hand; the reference: the primary's own state, read the same way."""
from __future__ import annotations

import logging

import torch

from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import Message, MsgType
from psrv.server.replication import stream
from psrv.server.service import ShardService
from tests.helpers import RecordingNet, hello_fields
from tests.helpers import send_to as send
from tests.states import assert_same_state

N = 64
PULL = {"codec": "topk:0.1", "resync": 0, "dense": [[0, 4]], "error_feedback": True, "sign_scale": "l1"}


def a_primary_mid_clock(cfg: ServerConfig) -> tuple[ShardService, RecordingNet]:
    """A sync shard of 3 workers under compressed pulls, driven by hand to the middle of clock 1: each worker's
    copy made, a step with momentum taken, each worker's step time known, worker 1's pull waiting for the barrier
    and rank 0's final pull for the others to leave."""
    primary_net = RecordingNet()
    primary = ShardService(cfg, primary_net)
    for w in (0, 1, 2):  # each from a process of its own (its session): who holds each rank
        send(primary, Message(MsgType.HELLO, worker=w, seq=1, session=70 + w, fields=hello_fields(N, 3, pull=PULL)))
    send(primary, Message(MsgType.INIT, worker=0, seq=2, session=70, tensor=torch.linspace(-1, 1, N)))
    for w in (0, 1, 2):  # clock 0, whole: every copy made, a step with momentum, each worker's step time
        send(primary, Message(MsgType.PUSH_PULL, worker=w, seq=3, clock=0, fields={"step_seconds": 0.01 * (w + 1)},
                              tensor=torch.full((N,), float(w + 1))))
    send(primary, Message(MsgType.PUSH_PULL, worker=1, seq=4, clock=1, fields={"step_seconds": 0.05},
                          tensor=torch.ones(N)))  # waits for clock 1's barrier: a pending pull
    send(primary, Message(MsgType.PULL, worker=0, seq=4, clock=1, fields={"final": True}))  # rank 0 finishing
    return primary, primary_net


def test_a_backup_given_its_primarys_state_holds_it_leaf_by_leaf_and_says_whose_it_took(caplog):
    cfg = ServerConfig(workers=3, mode="sync", optimizer=OptimConfig("sgd", lr=0.1, momentum=0.9))
    primary, primary_net = a_primary_mid_clock(cfg)
    state = primary.replication.replica_state()
    assert state["pulls"]["copies"] and state["pending"] and state["speeds"] and state["finishing"] == [0]
    assert state["sessions"] and state["stats"]

    net = RecordingNet()
    backup = ShardService(cfg, net)
    with caplog.at_level(logging.INFO, logger="psrv.server"):
        backup.replication.load_replica_state(stream.state_from(stream.state_bytes(state)),
                                              source="primary tcp://10.0.0.1:5000's state")
    assert_same_state(state, backup.replication.replica_state(), "the backup's replica state")
    assert backup.state.resumed_from is None  # a backup carries the shard on: it resumed no checkpoint
    lines = [r.getMessage() for r in caplog.records if "resumed from" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("shard 0: resumed from primary tcp://10.0.0.1:5000's state at "
                                                   "version 1"), lines
    # worker 2's push closes clock 1 (rank 0 finishing): each releases the pull it held for worker 1 (the backup on
    # no connection yet: the worker sends it again to a new primary) and answers worker 2's, alike
    answers = []
    for shard, out in ((primary, primary_net.out), (backup, net.out)):
        out.clear()
        send(shard, Message(MsgType.PUSH_PULL, worker=2, seq=4, clock=1, session=72, tensor=torch.ones(N)))
        answers.append(sorted((m.type.name, m.seq, m.fields.get("version"), m.fields.get("clock")) for m in out))
    assert answers == [[("WEIGHTS", 4, 2, 2)] * 2, [("WEIGHTS", 4, 2, 2)]], answers
    assert primary.pulls.pending.workers() == backup.pulls.pending.workers() == {0}  # rank 0's final pull waits on


def test_a_shard_with_no_state_yet_sends_none_and_a_backup_loads_nothing():
    """Before the first HELLO a primary has no state: it sends none, and the backup's shard stays as made."""
    cfg = ServerConfig(workers=1, mode="async")
    assert ShardService(cfg, RecordingNet()).replication.replica_state() is None
    backup = ShardService(cfg, RecordingNet())
    backup.replication.load_replica_state(None, source="primary P's state")
    assert backup.state.shard is None and backup.replication.replica_state() is None
