"""CURVE: only allow-listed keys get through; admin messages need it; intruders change nothing."""
from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from psrv.cli import main as psrv_main
from psrv.client.admin import admin_request
from psrv.client.psclient import PSClient
from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import MsgType
from psrv.partition import ParamSpec, PartitionPlan
from psrv.server.service import ShardService
from psrv.transport import create_server

PLAN = PartitionPlan((ParamSpec("w", (64,)),), 1)


@pytest.fixture
def keys(tmp_path):
    good, other = tmp_path / "keys", tmp_path / "intruder"
    assert psrv_main(["keygen", str(good), "--workers", "2"]) == 0
    assert psrv_main(["keygen", str(other), "--workers", "2"]) == 0
    shutil.copy(good / "server.key", other / "server.key")  # the intruder knows the public server key
    assert oct((good / "worker-0.key_secret").stat().st_mode & 0o777) == "0o600"
    return good, other


@pytest.fixture
def shard(keys, tmp_path):
    good, _ = keys
    cfg = ServerConfig(workers=2, mode="async", worker_timeout=60, curve_keys=str(good),
                       checkpoint_dir=str(tmp_path / "ck"), optimizer=OptimConfig(name="sgd", lr=0.5, momentum=0))
    svc = ShardService(cfg, create_server("zmq", "tcp://127.0.0.1:0", curve_keys=str(good)))
    thread = threading.Thread(target=svc.serve, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield svc
    svc.state.stopped = True
    thread.join(10)
    svc.transport.close()


def client(address: str, keys_dir, rank: int, timeout: float = 30.0) -> PSClient:
    return PSClient([address], PLAN, worker=rank, world_size=2, timeout=timeout, retry_interval=0.5,
                    curve_keys=str(keys_dir) if keys_dir else "")


@pytest.mark.timeout(120)
def test_unknown_key_gets_nothing_through_and_changes_nothing(keys, shard):
    good, other = keys
    address = shard.transport.address
    with client(address, good, 0) as c:
        c.hello()
        c.init(torch.zeros(PLAN.total))
        c.push(torch.ones(PLAN.total), clock=0)
        before = shard.shard.weights.clone()
        assert torch.equal(before, torch.full((PLAN.total,), -0.5))
        # an unlisted key pair, and no CURVE at all, each try to join and push as worker 1. A listed
        # client's round trip here takes milliseconds; the intruders get 1 s (a probe and a reconnect
        # within it), and the checks below would also see a push that got in later. The two intruders
        # try at once, from two threads: each waits out its own three 1 s timeouts.
        def intrude(keys_dir) -> None:
            with client(address, keys_dir, 1, timeout=1.0) as intruder:
                with pytest.raises(TimeoutError):
                    intruder.hello()
                with pytest.raises(TimeoutError):
                    intruder.push(torch.full((PLAN.total,), 100.0), clock=0)
            with pytest.raises(TimeoutError):
                admin_request(address, MsgType.SHUTDOWN, curve_keys=str(keys_dir or ""), name="worker-0",
                              timeout=1)
        with ThreadPoolExecutor(2) as pool:
            for attempt in [pool.submit(intrude, keys_dir) for keys_dir in (other, None)]:
                attempt.result(timeout=60)  # what failed in an intruder's thread fails the test here
        assert not shard.state.stopped and shard.shard.version == 1 and shard.state.stats.pushes == 1
        assert torch.equal(shard.shard.weights, before)
        out = torch.empty(PLAN.total)
        c.pull(clock=0, out=out)
        assert torch.equal(out, before)
        c.leave()


@pytest.mark.timeout(120)
def test_admin_messages_work_over_curve(keys, shard, tmp_path):
    good, _ = keys
    address = shard.transport.address
    with client(address, good, 0) as c:
        c.hello()
        c.init(torch.arange(PLAN.total, dtype=torch.float32))
        answer = admin_request(address, MsgType.CHECKPOINT, curve_keys=str(good))
        assert answer["version"] == 0 and (tmp_path / "ck" / "shard-0-of-1.ckpt").exists()
        assert admin_request(address, MsgType.STATS, curve_keys=str(good))["active"] == [0, 1]
        c.leave()  # before SHUTDOWN: a stopped shard answers no LEAVE, and the client waited out 5 s for it
        assert admin_request(address, MsgType.SHUTDOWN, curve_keys=str(good)) == {}
        assert shard.state.stopped


@pytest.mark.timeout(180)
def test_psrv_serve_and_worker_train_over_curve(keys, procs, tmp_path):
    good, _ = keys
    server, address = procs.server("server", "--workers", "1", "--mode", "async", "--curve-keys", str(good),
                                   "--out", str(tmp_path / "s.json"))
    worker = procs.start("worker", "worker", "--servers", address, "--steps", "20", "--curve-keys", str(good))
    assert procs.wait(worker, timeout=150) == 0, procs.log("worker")
    assert procs.wait(server, timeout=30) == 0, procs.log("server")
    assert '"updates_applied": 20' in (tmp_path / "s.json").read_text()
