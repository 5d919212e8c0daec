"""State, not surgery: each stateful part of a shard, and the service composing them, goes through
state_dict/load_state_dict into a fresh instance and then behaves exactly as the original does."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from prometheus_client import CollectorRegistry

from psrv.checkpoint import CheckpointError
from psrv.config import OptimConfig, ServerConfig
from psrv.metrics import ServerMetrics
from psrv.protocol import Message, MsgType, encode
from psrv.server.consistency import SSPController, SyncController
from psrv.server.dedup import Dedup
from psrv.server.liveness import Liveness
from psrv.server.service import ShardService
from psrv.server.shard import Shard
from tests.helpers import ROOT, RecordingNet

pytestmark = pytest.mark.timeout(60)
SIZE = 8
SGD = OptimConfig(name="sgd", lr=0.1, momentum=0.9)
ADAM = OptimConfig(name="adam", lr=0.01)
ONEBIT = OptimConfig(name="onebit_adam", lr=0.01, freeze_step=1)  # its step 2 on is past the freeze


def g(value: float) -> torch.Tensor:
    return torch.linspace(-1, 1, SIZE) * value


class Svc:
    """A ShardService on a fake clock, driven by hand; `req` returns the request's reply (or None)."""

    def __init__(self, *, mode="sync", workers=2, optim=SGD, metrics=None, **kw):
        self.t = 0.0
        self.cfg = ServerConfig(workers=workers, mode=mode, staleness=1, worker_timeout=3.0, optimizer=optim, **kw)
        self.svc = ShardService(self.cfg, RecordingNet(), metrics=metrics, now=lambda: self.t)

    def req(self, mtype, worker=0, *, seq, clock=0, tensor=None, **fields) -> Message | None:
        out = self.svc.transport.out
        n = len(out)
        self.svc.handle(f"peer-{worker}".encode(), encode(Message(mtype, worker=worker, seq=seq, clock=clock,
                                                                  fields=fields, tensor=tensor)))
        return out[n] if len(out) > n else None

    def hello(self, worker: int) -> Message:
        return self.req(MsgType.HELLO, worker, seq=1, plan_hash="plan", total=SIZE, num_shards=1, shard=0,
                        world_size=self.cfg.workers)

    def tick(self, seconds: float) -> None:
        for _ in range(round(seconds / 0.1)):  # the loop looks every 0.1s
            self.t += 0.1
            self.svc.membership.check_liveness()

    @property
    def weights(self) -> torch.Tensor:
        return self.svc.shard.weights.clone()


def trained(mode: str, optim: OptimConfig) -> Svc:
    """Three clocks of both workers, then worker 0's push of clock 3 (half a barrier in sync mode)."""
    s = Svc(mode=mode, optim=optim)
    for w in range(2):
        s.hello(w)
    s.req(MsgType.INIT, 0, seq=2, tensor=torch.linspace(0, 1, SIZE))
    for clock in range(3):
        for w in range(2):
            assert "dropped" not in s.req(MsgType.PUSH, w, seq=10 + clock, clock=clock, tensor=g(w + clock + 1)).fields
    s.req(MsgType.PUSH, 0, seq=20, clock=3, tensor=g(5))
    return s


def carry_on(s: Svc) -> None:
    """The same requests, whichever service gets them: a re-sent push, then two more clocks."""
    again = s.req(MsgType.PUSH, 0, seq=20, clock=3, tensor=g(5))
    assert again.fields["duplicate"]
    s.req(MsgType.PUSH, 1, seq=21, clock=3, tensor=g(-2))
    for clock in (4, 5):
        for w in range(2):
            s.req(MsgType.PUSH, w, seq=30 + clock, clock=clock, tensor=g(clock - w))


# --- the service ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "async", "ssp"])
@pytest.mark.parametrize("optim", [SGD, ADAM], ids=["sgd-momentum", "adam"])
def test_a_service_carries_on_from_its_state_dict_exactly(mode, optim):
    a = trained(mode, optim)
    b = Svc(mode=mode, optim=optim)
    b.svc.load_state_dict(a.svc.state_dict())
    assert torch.equal(b.weights, a.weights) and b.svc.shard.version == a.svc.shard.version > 0
    assert b.svc.controller.clocks == a.svc.controller.clocks == {0: 4, 1: 3}
    assert b.svc.controller.active == {0, 1} and b.svc.state.plan_hash == "plan"
    assert b.svc.state.resumed_from == a.svc.shard.version
    assert b.hello(0).fields["last_seq"] == a.hello(0).fields["last_seq"] == 20  # the dedup table came along
    carry_on(a)
    want = a.weights, a.svc.shard.version, dict(a.svc.controller.clocks)
    carry_on(b)  # had b kept a's tensors instead of copies, this would step them a second time
    assert torch.equal(b.weights, want[0]) and b.svc.shard.version == want[1] and b.svc.controller.clocks == want[2]
    assert b.svc.state.stats.duplicates == 1 and not b.svc.state.stats.dropped


def finished_and_pushed(mode: str, quorum: int) -> "Svc":
    """A shard of 3 workers: worker 0 pushed clock 0 and sent its final pull, then worker 1 pushed clock 0."""
    a = Svc(mode=mode, workers=3, quorum=quorum)
    for w in range(3):
        a.hello(w)
    a.req(MsgType.INIT, 0, seq=2, tensor=torch.linspace(0, 1, SIZE))
    a.req(MsgType.PUSH, 0, seq=10, clock=0, tensor=g(1))
    a.req(MsgType.PULL, 0, seq=11, clock=1, final=True)
    a.req(MsgType.PUSH, 1, seq=10, clock=0, tensor=g(2))
    return a


@pytest.mark.parametrize("mode,quorum", [("sync", 2), ("sync", 0)], ids=["quorum", "barrier"])
def test_a_backup_from_the_replica_state_counts_a_finished_worker_out_as_its_primary_does(mode, quorum):
    """Worker 0 pushed and sent its final pull; the state a joining backup loads says so: the backup's merge (or
    barrier) waits for workers 1 and 2, as the primary's does, instead of closing on 0's push and 1's (it did,
    in a fresh-clone run: rule 3 of the history flagged the backup's merge after the failover)."""
    a = finished_and_pushed(mode, quorum)
    b = Svc(mode=mode, workers=3, quorum=quorum)
    b.svc.replication.load_replica_state(a.svc.replication.replica_state(), source="the primary")
    for s in (a, b):
        assert s.svc.controller.finishing == {0} and s.svc.controller.pushing() == {1, 2}
        assert s.svc.shard.version == 0  # one of the two workers still pushing is in: no step yet
        s.req(MsgType.PUSH, 2, seq=10, clock=0, tensor=g(3))
    assert b.svc.shard.version == a.svc.shard.version == 1 and torch.equal(b.weights, a.weights)


def test_a_checkpoint_forgets_who_finished_so_a_merge_it_makes_ready_commits_at_the_load():
    """A checkpoint leaves out the workers that sent their final pull (a resumed run's workers start again): the
    quorum merge of worker 0's push (finished) and worker 1's, one of Q = 2 on the primary, has its two once
    loaded, and commits at the load, as after any change that makes a merge ready; not at the next request."""
    a = finished_and_pushed("sync", 2)
    assert a.svc.shard.version == 0
    b = Svc(mode="sync", workers=3, quorum=2)
    b.svc.load_state_dict(a.svc.state_dict())
    assert b.svc.controller.finishing == set() and b.svc.shard.version == 1
    want = torch.linspace(0, 1, SIZE) - 0.1 * (g(1) + g(2)) / 2
    assert torch.allclose(b.weights, want, atol=1e-6), (b.weights - want).abs().max()


def test_a_state_dict_is_plain_data_that_survives_torch_save():
    state = trained("sync", ADAM).svc.state_dict()
    assert set(state) == {"shard", "num_shards", "workers", "mode", "optimizer", "plan_hash", "size",
                          "shard_state", "controller", "dedup", "liveness", "fragments"}
    import io
    buf = io.BytesIO()
    torch.save(state, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)  # no pickled objects inside
    b = Svc(mode="sync", optim=ADAM)
    b.svc.load_state_dict(back)
    assert b.svc.controller.arrived == {0} and b.svc.shard.version == 3


def test_a_state_of_another_job_or_a_broken_one_is_refused_and_nothing_changes():
    state = trained("sync", SGD).svc.state_dict()
    other = Svc(mode="sync", workers=3)
    with pytest.raises(CheckpointError, match=r"another job: workers 2 \(this server: 3\)"):
        other.svc.load_state_dict(state)
    assert other.svc.shard is None and other.svc.state.plan_hash is None and other.svc.state.resumed_from is None
    with pytest.raises(CheckpointError, match=r"optimizer 'sgd' \(this server: 'adam'\)"):
        Svc(mode="sync", optim=ADAM).svc.load_state_dict(state)
    momentum = state["shard_state"]["optimizer"]["state"][0]
    momentum["momentum_buffer"] = torch.zeros(SIZE + 1)
    b = trained("sync", SGD)
    before = b.weights, b.svc.shard, b.svc.controller
    with pytest.raises(CheckpointError, match="incomplete or inconsistent.*momentum_buffer"):
        b.svc.load_state_dict(state)
    assert torch.equal(b.weights, before[0]) and (b.svc.shard, b.svc.controller) == before[1:]


def test_a_restored_sync_shard_behind_the_others_counts_its_void_sum_as_late():
    a = trained("sync", SGD)          # clock 3 holds worker 0's gradient
    b = Svc(mode="sync")
    b.svc.load_state_dict(a.svc.state_dict())
    b.req(MsgType.PUSH, 1, seq=40, clock=5, tensor=g(1))  # the other shards committed clocks 3 and 4
    assert b.svc.state.stats.dropped == {"late": 1} and b.svc.summary()["lost_clocks"] == 2
    assert b.svc.controller.open_clock == 5 and b.svc.controller.arrived == {1}


# --- each part --------------------------------------------------------------------------
@pytest.mark.parametrize("optim", [SGD, ADAM, ONEBIT], ids=["sgd-momentum", "adam", "onebit_adam"])
def test_a_shard_carries_on_from_its_state_dict(optim):
    a = Shard(SIZE, optim)
    a.init(torch.linspace(0, 1, SIZE))
    a.apply(g(1))
    a.accumulate(g(2))
    b = Shard(SIZE, optim)
    b.load_state_dict(a.state_dict())
    assert b.initialised and b.version == 1 and torch.equal(b.weights, a.weights)
    for s in (a, b):
        s.accumulate(g(3))
        assert s.apply_accumulated() == 2
        s.apply(g(-1))
    assert torch.equal(b.weights, a.weights) and b.version == a.version == 3
    wrong = Shard(SIZE + 1, optim)
    with pytest.raises(ValueError, match="shape"):
        wrong.load_state_dict(a.state_dict())
    assert wrong.version == 0 and not wrong.weights.any()



def test_a_clocks_first_gradient_writes_over_the_last_sum_and_a_state_between_clocks_holds_none():
    """Sync's sum is not zeroed after its step: the next clock's first gradient writes over it (bf16 widened as
    an add would). A state taken between clocks holds no sum, and loading it closes the loader's open one."""
    a = Shard(SIZE, SGD)
    a.init(torch.zeros(SIZE))
    a.accumulate(g(5))
    a.accumulate(g(7))
    a.apply_accumulated()  # the sum's buffer still holds g(5) + g(7), divided
    state = a.state_dict()
    assert "accum" not in state and state["accumulated"] == 0
    b = Shard(SIZE, SGD)
    b.init(torch.zeros(SIZE))
    b.accumulate(g(9))  # an open clock, which the loaded state has not
    b.load_state_dict(state)
    for s in (a, b):
        s.accumulate(g(2).to(torch.bfloat16))
        s.accumulate(g(4), weight=1)
        assert s.apply_accumulated() == 2
    want = torch.zeros(SIZE, requires_grad=True)  # torch's SGD on each clock's mean, summed from zeros
    opt = torch.optim.SGD([want], lr=SGD.lr, momentum=SGD.momentum, foreach=False)
    for grads in ((g(5), g(7)), (g(2).to(torch.bfloat16).float(), g(4))):
        want.grad = (torch.zeros(SIZE) + grads[0] + grads[1]) / 2
        opt.step()
    for s in (a, b):
        assert torch.allclose(s.weights, want.detach(), rtol=0, atol=1e-7), (s.weights - want).abs().max()


def test_controllers_carry_on_from_their_state_dicts():
    a = SyncController(3, backup_workers=1)
    a.push(0, 0), a.push(1, 0)
    a.committed()
    a.push(2, 1)
    a.leave(1)
    b = SyncController(3, backup_workers=1)
    b.load_state_dict(a.state_dict())
    assert (b.open_clock, b.arrived, b.active, b.clocks) == (a.open_clock, a.arrived, a.active, a.clocks)
    assert b.push(2, 1) == a.push(2, 1) and b.commit_ready() == a.commit_ready()
    ssp = SSPController(2, staleness=1)
    ssp.push(0, 0), ssp.push(0, 1)
    back = SSPController(2, staleness=1)
    back.load_state_dict(ssp.state_dict())
    assert back.min_clock() == 0 and not back.pull_ready(0, 2) and back.pull_ready(1, 1)
    back.push(1, 0)
    assert back.min_clock() == 1 and back.pull_ready(0, 2)
    with pytest.raises(ValueError, match="'ssp' controller, this server runs 'sync'"):
        SyncController(2).load_state_dict(ssp.state_dict())


def test_dedup_and_liveness_carry_on_from_their_state_dicts():
    a = Dedup()
    a.note(0, 9)
    a.record(0, 7, {"version": 3, "staleness": 1})
    b = Dedup()
    b.load_state_dict(a.state_dict())
    assert b.replay(0, 7, 5) == a.replay(0, 7, 5) == {"version": 3, "staleness": 1, "duplicate": True}
    assert b.replay(0, 8, 5) is None and b.last_seq(0) == 9
    t = [0.0]
    live = Liveness(timeout=1.0, join_timeout=5.0, now=lambda: t[0])
    live.left.add(1), live.lost.add(2)
    back = Liveness(timeout=1.0, join_timeout=5.0, now=lambda: t[0])
    back.load_state_dict(live.state_dict())
    assert (back.left, back.lost) == ({1}, {2})
    back.rejoined(2)
    assert back.lost == set()


# --- metrics hygiene and layering ---------------------------------------------------------
def _clock_series(registry: CollectorRegistry, worker: int) -> float | None:
    return registry.get_sample_value("psrv_worker_clock", {"shard": "0", "mode": "async", "worker": str(worker)})


@pytest.mark.parametrize("how", ["LEAVE", "silence"])
def test_a_departed_workers_clock_series_is_forgotten(how):
    registry = CollectorRegistry()
    s = Svc(mode="async", metrics=ServerMetrics(registry, shard=0, mode="async"))
    for w in range(2):
        s.hello(w)
    s.req(MsgType.INIT, 0, seq=2, tensor=torch.zeros(SIZE))
    for w in range(2):
        s.req(MsgType.PUSH, w, seq=3, clock=0, tensor=g(1))
    assert _clock_series(registry, 0) == _clock_series(registry, 1) == 1
    if how == "LEAVE":
        assert s.req(MsgType.LEAVE, 1, seq=4).type is MsgType.OK
    else:
        for _ in range(4):
            s.req(MsgType.HEARTBEAT, 0, seq=4)
            s.tick(1.0)
    assert s.svc.controller.active == {0}
    assert _clock_series(registry, 1) is None and _clock_series(registry, 0) == 1
    s.hello(1)  # a rejoined worker's series comes back with its next push
    s.req(MsgType.PUSH, 1, seq=5, clock=1, tensor=g(1))
    assert _clock_series(registry, 1) == 2


def test_checkpoint_io_imports_nothing_of_the_server():
    """psrv.server.* uses psrv.checkpoint, never the other way round (no import circle)."""
    code = "import sys, psrv.checkpoint; print(*sorted(m for m in sys.modules if m.startswith('psrv.')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["psrv.atomic", "psrv.checkpoint"]  # its atomic write, and nothing of the server
