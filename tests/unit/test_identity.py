"""Who holds a rank, and stale-clock pushes, on a ShardService with a fake clock and an in-memory
transport: a second live process with a taken rank is refused and changes nothing; a restarted
one takes the rank over once the old one is silent or gone."""
from __future__ import annotations

import msgpack
import pytest
import torch

from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import PROTOCOL_VERSION, ErrorCode, Message, MsgType, ProtocolError, decode, encode
from psrv.server.pushes.late import LateStreaks
from psrv.server.service import ShardService
from tests.helpers import RecordingNet

pytestmark = pytest.mark.timeout(30)
SIZE = 4
FIRST, TWIN = 11, 22  # session ids of two processes claiming rank 1


class Shard:
    def __init__(self, *, workers=2, timeout=3.0):
        self.t = 0.0
        cfg = ServerConfig(workers=workers, mode="sync", worker_timeout=timeout,
                           optimizer=OptimConfig(name="sgd", lr=1.0, momentum=0.0))
        self.net = RecordingNet()
        self.svc = ShardService(cfg, self.net, now=lambda: self.t, join_timeout=60.0)
        self.seq = 0

    def req(self, mtype, worker, session, *, clock=0, tensor=None, **fields) -> Message:
        self.seq += 1
        n = len(self.net.out)
        msg = Message(mtype, worker=worker, seq=self.seq, clock=clock, fields=fields, tensor=tensor, session=session)
        self.svc.handle(f"peer-{session}".encode(), encode(msg))
        self.svc.membership.check_liveness()
        out = self.net.out[n:]
        return out[0] if out else None

    def advance(self, seconds: float) -> None:
        """Time passes with the loop turning (a jump would look like a stalled shard, which drops nobody)."""
        for _ in range(round(seconds / 0.1)):
            self.t += 0.1
            self.svc.membership.check_liveness()

    def hello(self, worker, session) -> Message:
        return self.req(MsgType.HELLO, worker, session, plan_hash="p", total=SIZE, num_shards=1, shard=0,
                        world_size=2)


def started() -> Shard:
    s = Shard()
    assert s.hello(0, 5).type is MsgType.WELCOME and s.hello(1, FIRST).type is MsgType.WELCOME
    assert s.req(MsgType.INIT, 0, 5, tensor=torch.zeros(SIZE)).type is MsgType.OK
    return s


def test_the_session_id_travels_in_the_header_and_is_checked():
    assert decode(encode(Message(MsgType.PUSH, worker=1, session=2**63 - 1))).session == 2**63 - 1
    assert decode(encode(Message(MsgType.PUSH, worker=1))).session == 0  # none given: no `sid` key
    with pytest.raises(ProtocolError, match="session must be integers"):
        decode([msgpack.packb({"t": int(MsgType.PUSH), "v": PROTOCOL_VERSION, "sid": "x"})])


def test_a_second_live_process_is_refused_and_touches_nothing():
    s = started()
    s.advance(1.0)
    refused = s.hello(1, TWIN)
    assert refused.type is MsgType.ERROR and refused.fields["code"] == ErrorCode.RANK_IN_USE
    assert refused.fields["message"] == ("rank 1 is already in use by another live worker (heard 1.0s ago); "
                                         "give each worker its own --rank")
    assert refused.fields["worker_timeout"] == 3.0
    for mtype in (MsgType.PUSH, MsgType.HEARTBEAT, MsgType.LEAVE):  # not a clock moved, not a beat counted
        assert s.req(mtype, 1, TWIN, tensor=torch.ones(SIZE) if mtype is MsgType.PUSH else None).fields["code"] \
            == ErrorCode.RANK_IN_USE
    assert s.svc.controller.clocks[1] == 0 and 1 in s.svc.controller.active and s.svc.shard.version == 0
    s.advance(2.5)  # the twin's requests did not keep rank 1 alive: the first, silent, is dropped
    assert 1 not in s.svc.controller.active
    assert s.req(MsgType.PUSH, 1, FIRST, tensor=torch.ones(SIZE)).fields.get("hello")  # the first says HELLO again


def test_a_restarted_process_takes_the_rank_over_after_silence_or_leave():
    s = started()
    s.advance(3.5)  # the first process of rank 1 died 3.5 s ago (worker_timeout 3)
    assert s.hello(1, TWIN).type is MsgType.WELCOME
    assert s.req(MsgType.HEARTBEAT, 1, FIRST).fields["code"] == ErrorCode.RANK_IN_USE  # the old one, back: refused
    assert s.req(MsgType.LEAVE, 1, TWIN).type is MsgType.OK
    assert s.hello(1, FIRST).type is MsgType.WELCOME  # after LEAVE anyone may have it


def test_a_process_whose_launcher_saw_the_last_one_die_takes_the_rank_at_once():
    """psrv run restarts a dead worker with PSRV_PREDECESSOR_DEAD (experiments/launcher/worker_restarts.py): its HELLO says
    so, and the rank is its at once, the dead one's clock dropped (a sync barrier stops waiting for it), not after
    --worker-timeout of silence; a HELLO without it is still refused."""
    s = started()
    s.advance(1.0)
    assert s.hello(1, TWIN).fields["code"] == ErrorCode.RANK_IN_USE
    taken = s.req(MsgType.HELLO, 1, TWIN, plan_hash="p", total=SIZE, num_shards=1, shard=0, world_size=2,
                  predecessor_dead=True)
    assert taken.type is MsgType.WELCOME and 1 in s.svc.controller.active
    assert s.req(MsgType.HEARTBEAT, 1, FIRST).fields["code"] == ErrorCode.RANK_IN_USE  # the dead one's, if it came


def test_requests_without_a_session_are_not_checked():
    s = started()
    assert s.req(MsgType.HEARTBEAT, 1, 0).type is MsgType.OK


def test_only_pushes_of_a_clock_already_pushed_count_as_stale():
    late = LateStreaks(shard=0)
    for clock in range(5):  # a straggler with backup workers: pushes the clock it was given, late each time
        assert late.dropped(1, clock=clock, pushed=clock, open_clock=clock + 1) == {}
    assert [late.dropped(1, clock=0, pushed=1, open_clock=4)["late"]["streak"] for _ in range(3)] == [1, 2, 3]
    late.applied(1)
    assert late.dropped(1, clock=0, pushed=1, open_clock=4)["late"] == {"streak": 1, "clock": 0, "open": 4}
