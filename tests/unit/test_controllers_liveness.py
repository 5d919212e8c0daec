"""The shard service as a state machine with a fake clock and an in-memory transport:
liveness, rejoin, backup workers, exactly-once pushes, bad numbers and admin refusal."""
from __future__ import annotations

import pytest
import torch

from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import ErrorCode, Message, MsgType, decode, encode
from psrv.server.consistency import SSPController, SyncController
from psrv.server.service import ShardService
from psrv.transport.base import ServerTransport

pytestmark = pytest.mark.timeout(30)
SIZE = 8
SGD = OptimConfig(name="sgd", lr=1.0, momentum=0.0)


class FakeNet(ServerTransport):
    address = "fake://shard"

    def __init__(self, authenticated: bool = False):
        self.out: list[tuple[object, Message]] = []
        self.authenticated = authenticated

    def recv(self, timeout):
        return None

    def send(self, peer, frames):
        self.out.append((peer, decode([bytes(memoryview(f)) for f in frames])))

    def close(self):
        pass


class Shard:
    """A ShardService with a fake clock; `req` sends one request and returns the replies it caused."""

    def __init__(self, *, workers=3, mode="sync", timeout=3.0, authenticated=False, **kw):
        self.t = 0.0
        self.cfg = ServerConfig(workers=workers, mode=mode, worker_timeout=timeout, optimizer=SGD, staleness=1, **kw)
        self.net = FakeNet(authenticated)
        self.svc = ShardService(self.cfg, self.net, now=lambda: self.t, join_timeout=60.0)
        self.seqs = {}

    def req(self, mtype, worker=0, *, peer=None, seq=None, clock=0, tensor=None, session=0, **fields):
        if seq is None:
            seq = self.seqs[worker] = self.seqs.get(worker, 0) + 1
        n = len(self.net.out)
        msg = Message(mtype, worker=worker, seq=seq, clock=clock, fields=fields, tensor=tensor, session=session)
        self.svc.handle(peer or f"peer-{worker}".encode(), encode(msg))
        self.svc.membership.check_liveness()
        return [m for _, m in self.net.out[n:]]

    def start(self, values=None):
        for w in range(self.cfg.workers):
            self.req(MsgType.HELLO, w, plan_hash="p", total=SIZE, num_shards=1, shard=0,
                     world_size=self.cfg.workers)
        assert self.req(MsgType.INIT, 0, tensor=torch.zeros(SIZE) if values is None else values)[0].type is MsgType.OK
        return self

    def tick(self, seconds):
        """Time passes with the shard idle: its loop looks every 0.1s."""
        for _ in range(round(seconds / 0.1)):
            self.t += 0.1
            self.svc.membership.check_liveness()

    @property
    def weights(self):
        return self.svc.shard.weights.clone()


def g(value):
    return torch.full((SIZE,), float(value))


# --- liveness ----------------------------------------------------------------------
def test_silent_worker_leaves_and_the_sync_barrier_stops_waiting():
    s = Shard(workers=3).start()
    for w in (0, 1):
        s.req(MsgType.HEARTBEAT, w)
        assert s.req(MsgType.PUSH_PULL, w, clock=0, tensor=g(1)) == []  # waiting for worker 2
    s.tick(2.0)
    for w in (0, 1):
        s.req(MsgType.HEARTBEAT, w)
    assert s.svc.shard.version == 0
    n = len(s.net.out)
    s.tick(1.5)                                    # worker 2 silent 3.5s > 3s
    answers = [m for _, m in s.net.out[n:]]
    assert [m.type for m in answers] == [MsgType.WEIGHTS, MsgType.WEIGHTS]
    assert s.svc.controller.active == {0, 1} and s.svc.state.stats.lost_workers == [2]
    assert s.svc.shard.version == 1 and torch.equal(s.weights, -g(1))
    assert s.svc.summary()["active"] == [0, 1]


def test_heartbeating_worker_with_a_pending_pull_is_still_judged_by_silence():
    s = Shard(workers=2).start()
    s.req(MsgType.HEARTBEAT, 1)
    s.req(MsgType.PUSH_PULL, 1, clock=0, tensor=g(1))   # pending: waits for worker 0
    s.req(MsgType.HEARTBEAT, 0)
    s.tick(2.0)
    s.req(MsgType.HEARTBEAT, 0)
    s.tick(2.0)                                          # worker 1 (killed while waiting) is silent 4s
    assert s.svc.controller.active == {0} and len(s.svc.pulls.pending) == 0


def test_worker_without_heartbeats_is_kept_while_it_waits():
    s = Shard(workers=2).start()
    s.req(MsgType.PUSH_PULL, 1, clock=0, tensor=g(1))
    for _ in range(3):
        s.req(MsgType.HEARTBEAT, 0)
        s.tick(2.0)
    assert s.svc.controller.active == {0, 1}


def test_time_the_shard_itself_was_busy_is_nobodys_silence():
    s = Shard(workers=2).start()
    s.t += 5.0                       # one 5s stall of the loop (say, a slow checkpoint)
    s.svc.membership.check_liveness()
    assert s.svc.controller.active == {0, 1}


def test_dropped_worker_is_asked_to_hello_again_and_rejoins_after_the_open_clock():
    s = Shard(workers=2).start()
    s.tick(2.0)
    s.req(MsgType.HEARTBEAT, 0)
    s.tick(2.0)
    assert s.svc.controller.active == {0}
    s.req(MsgType.PUSH_PULL, 0, clock=0, tensor=g(2))
    s.req(MsgType.PUSH_PULL, 0, clock=1, tensor=g(2))
    (err,) = s.req(MsgType.PUSH, 1, clock=0, tensor=g(1))
    assert err.type is MsgType.ERROR and err.fields["hello"] and err.fields["code"] == ErrorCode.NOT_ALLOWED
    (welcome,) = s.req(MsgType.HELLO, 1, plan_hash="p", total=SIZE, num_shards=1, shard=0, world_size=2)
    # worker 0 pushes the open clock 2: the rejoiner counts from clock 3, whose weights it pulls first
    assert welcome.fields["clock"] == 3 and welcome.fields["version"] == 2
    assert welcome.fields["last_seq"] >= 1 and s.svc.controller.active == {0, 1}


def test_a_restarted_worker_never_holds_the_open_clock_and_is_waited_for_from_the_next():
    """A new process of rank 1 takes the rank over (its old one silent) in the middle of clock 1: worker 0's
    push of clock 1 is applied without it; its first pull gets clock 2's weights, and clock 2 waits for it."""
    s = Shard(workers=2, timeout=3.0)
    hello = {"plan_hash": "p", "total": SIZE, "num_shards": 1, "shard": 0, "world_size": 2}
    for w in (0, 1):
        s.req(MsgType.HELLO, w, session=10 + w, **hello)
    s.req(MsgType.INIT, 0, session=10, tensor=torch.zeros(SIZE))
    s.req(MsgType.PUSH_PULL, 0, session=10, clock=0, tensor=g(1))
    s.req(MsgType.PUSH_PULL, 1, session=11, clock=0, tensor=g(1))  # clock 0 committed; worker 1's process dies
    s.tick(2.0)
    s.req(MsgType.HEARTBEAT, 0, session=10)
    s.tick(0.9)
    s.req(MsgType.HEARTBEAT, 0, session=10)
    s.t += 0.2                                    # rank 1 silent 3.1s: past worker_timeout, not yet looked at
    (welcome,) = s.req(MsgType.HELLO, 1, session=99, **hello)
    assert welcome.fields["clock"] == 2 and s.svc.controller.active == {0, 1}
    assert s.req(MsgType.PULL, 1, session=99, clock=2) == []  # clock 1's weights do not exist yet
    answers = s.req(MsgType.PUSH_PULL, 0, session=10, clock=1, tensor=g(3))  # applied at once: no wait for rank 1
    assert sorted(m.fields["clock"] for m in answers) == [2, 2] and s.svc.shard.version == 2
    assert s.req(MsgType.PUSH_PULL, 0, session=10, clock=2, tensor=g(1)) == []  # clock 2 waits for the rejoiner
    assert len(s.req(MsgType.PUSH_PULL, 1, session=99, clock=2, tensor=g(3))) == 2 and s.svc.shard.version == 3
    assert torch.equal(s.weights, -g(1 + 3 + 2))              # clock 2 is the mean of both


def test_ssp_minimum_clock_ignores_a_lost_worker():
    s = Shard(workers=2, mode="ssp").start()
    s.req(MsgType.HEARTBEAT, 0)
    s.req(MsgType.PUSH, 0, clock=0, tensor=g(1))
    s.req(MsgType.PUSH, 0, clock=1, tensor=g(1))
    assert s.req(MsgType.PULL, 0, clock=2) == []          # 2 - min(2, 0) > 1
    s.tick(2.0)
    s.req(MsgType.HEARTBEAT, 0)
    n = len(s.net.out)
    s.tick(2.0)
    assert [m.type for _, m in s.net.out[n:]] == [MsgType.WEIGHTS]


# --- backup workers ----------------------------------------------------------------
def test_backup_workers_commit_at_n_minus_b_and_drop_late_gradients():
    s = Shard(workers=3, backup_workers=1).start()
    assert s.req(MsgType.PUSH_PULL, 0, clock=0, tensor=g(1)) == []
    answers = s.req(MsgType.PUSH_PULL, 1, clock=0, tensor=g(3))
    assert [m.type for m in answers] == [MsgType.WEIGHTS, MsgType.WEIGHTS]
    assert torch.equal(s.weights, -g(2))                  # the mean of the first N-b = 2
    (late,) = s.req(MsgType.PUSH_PULL, 2, clock=0, tensor=g(100))
    assert late.fields["push"]["dropped"] == "late" and late.fields["clock"] == 1
    assert s.svc.state.stats.dropped["late"] == 1 and torch.equal(s.weights, -g(2))


def test_sync_controller_needed_counts():
    c = SyncController(4, backup_workers=1)
    assert c.needed() == 3
    c.leave(3)
    assert c.needed() == 2
    assert SSPController(2, staleness=0).pull_ready(0, 0)


# --- exactly once ----------------------------------------------------------------
def test_resent_push_is_answered_but_applied_once():
    s = Shard(workers=1, mode="async").start()
    (first,) = s.req(MsgType.PUSH, 0, seq=5, tensor=g(1))
    (again,) = s.req(MsgType.PUSH, 0, seq=5, tensor=g(1), peer=b"new-connection")
    assert first.fields["version"] == again.fields["version"] == 1 and again.fields["duplicate"]
    assert s.svc.shard.version == 1 and s.svc.state.stats.duplicates == 1 and torch.equal(s.weights, -g(1))


def test_resent_push_pull_still_gets_its_weights():
    s = Shard(workers=2).start()
    assert s.req(MsgType.PUSH_PULL, 0, seq=7, clock=0, tensor=g(1)) == []
    assert s.req(MsgType.PUSH_PULL, 0, seq=7, clock=0, tensor=g(1), peer=b"reconnected") == []
    answers = s.req(MsgType.PUSH_PULL, 1, clock=0, tensor=g(3))
    peers = [p for p, m in s.net.out[-len(answers):]]
    assert b"reconnected" in peers and b"peer-0" in peers and s.svc.shard.version == 1
    assert torch.equal(s.weights, -g(2))
    # its answer was lost: the third copy is answered at once, from the dedup table
    (again,) = s.req(MsgType.PUSH_PULL, 0, seq=7, clock=0, tensor=g(1))
    assert again.type is MsgType.WEIGHTS and again.fields["push"]["duplicate"] and s.svc.shard.version == 1


def test_probe_says_whether_a_request_is_held():
    s = Shard(workers=2).start()
    s.req(MsgType.PULL, 0, seq=3, clock=1)
    (held,) = s.req(MsgType.HEARTBEAT, 0, seq=3, probe=3)
    (other,) = s.req(MsgType.HEARTBEAT, 0, seq=4, probe=4)
    assert held.fields["holding"] and not other.fields["holding"]


# --- bad numbers and admin -----------------------------------------------------------
@pytest.mark.parametrize("mode", ["reject", "skip"])
def test_nonfinite_gradients_never_reach_the_parameters(mode):
    s = Shard(workers=1, mode="async", nonfinite=mode).start(values=g(0.5))
    bad = g(1)
    bad[3] = float("nan")
    (reply,) = s.req(MsgType.PUSH, 0, tensor=bad)
    if mode == "reject":
        assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.NONFINITE
    else:
        assert reply.type is MsgType.OK and reply.fields["dropped"] == "nonfinite"
    inf = torch.full((SIZE,), 3e38)  # finite values whose sum overflows are still applied
    assert s.req(MsgType.PUSH, 0, tensor=inf)[0].type is MsgType.OK
    assert s.svc.state.stats.dropped["invalid"] == 1 and s.svc.shard.version == 1


def test_nonfinite_initial_weights_are_refused():
    s = Shard(workers=1, mode="async")
    s.req(MsgType.HELLO, 0, plan_hash="p", total=SIZE, num_shards=1, shard=0, world_size=1)
    (reply,) = s.req(MsgType.INIT, 0, tensor=torch.full((SIZE,), float("inf")))
    assert reply.fields["code"] == ErrorCode.NONFINITE and not s.svc.shard.initialised


@pytest.mark.parametrize("mtype", [MsgType.SHUTDOWN, MsgType.CHECKPOINT])
def test_admin_needs_an_authenticated_transport(mtype, tmp_path):
    s = Shard(workers=1, mode="async", checkpoint_dir=str(tmp_path)).start()
    (reply,) = s.req(mtype)
    assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.NOT_ALLOWED
    assert not s.svc.state.stopped and not list(tmp_path.iterdir())
    s = Shard(workers=1, mode="async", checkpoint_dir=str(tmp_path), authenticated=True).start()
    replies = s.req(mtype)
    if mtype is MsgType.CHECKPOINT:  # written off the loop, answered once on disk (as serve() does each poll)
        assert not replies
        s.svc.checkpoints.writer.wait(30)
        s.svc.checkpoints.answer_admin()
        replies = [m for _, m in s.net.out[-1:]]
    assert replies[0].type is MsgType.OK


def test_a_hello_for_a_huge_shard_is_refused_without_allocating():
    s = Shard(workers=1, mode="async", max_message_bytes=1 << 20)
    (reply,) = s.req(MsgType.HELLO, 0, plan_hash="p", total=1 << 40, num_shards=1, shard=0, world_size=1)
    assert reply.fields["code"] == ErrorCode.TOO_LARGE and s.svc.shard is None
