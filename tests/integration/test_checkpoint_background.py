"""Checkpoints off the shard's event loop: pushes are answered while one is written, the file holds the
state of the moment it was taken, and a kill -9 mid-write leaves the previous checkpoint to resume from.

Writes are paced with PSRV_CHECKPOINT_BYTES_PER_S so that one lasts seconds on a small shard: the test
sees it in flight without a shard of hundreds of MB."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from psrv.checkpoint import PACE_ENV, checkpoint_path, read_verified
from psrv.config import OptimConfig, ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import Message, MsgType, encode
from psrv.server.checkpoints.writer import detached
from psrv.server.service import ShardService
from psrv.client.admin import admin_request
from tests.helpers import RecordingNet

SIZE = 1 << 18              # 1 MiB of float32 parameters, 1 MiB of momentum: about 2 MiB a checkpoint
PACE = 1 << 20              # bytes per second: a write lasts about 2 s
MOMENTUM = OptimConfig(name="sgd", lr=0.1, momentum=0.9)


def push(svc: ShardService, seq: int, value: float) -> float:
    """Push `value` everywhere as worker 0 (async); the seconds until its answer was sent."""
    net = svc.transport
    sent = len(net.out)
    started = time.perf_counter()
    svc.handle(b"peer", encode(Message(MsgType.PUSH, worker=0, seq=seq, clock=seq,
                                       tensor=torch.full((SIZE,), value))))
    seconds = time.perf_counter() - started
    assert len(net.out) == sent + 1 and net.out[-1].type is MsgType.OK, net.out[-1]
    return seconds


def async_shard(tmp_path) -> ShardService:
    cfg = ServerConfig(workers=1, mode="async", optimizer=MOMENTUM, checkpoint_dir=str(tmp_path))
    svc = ShardService(cfg, RecordingNet())
    svc.handle(b"peer", encode(Message(MsgType.HELLO, worker=0, seq=1, fields={
        "plan_hash": "p", "total": SIZE, "num_shards": 1, "shard": 0, "world_size": 1})))
    svc.handle(b"peer", encode(Message(MsgType.INIT, worker=0, seq=2, tensor=torch.zeros(SIZE))))
    return svc


def tensors(state, path=""):
    """Every tensor in a nested state dict, by its path of keys."""
    if torch.is_tensor(state):
        return {path: state}
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    return {k: t for key, value in items for k, t in tensors(value, f"{path}/{key}").items()}


@pytest.mark.timeout(60)
def test_the_copy_a_writer_gets_shares_nothing_with_the_shard_it_was_taken_from(tmp_path):
    svc = async_shard(tmp_path)
    push(svc, 3, 1.0)
    live, before = svc.state_dict(), tensors(svc.state_dict())
    before = {k: t.clone() for k, t in before.items()}
    copy = detached(live)
    push(svc, 4, 2.0)  # steps the parameters and the momentum in place
    stepped = tensors(svc.state_dict())
    assert {"/shard_state/param", "/shard_state/optimizer/state/0/momentum_buffer"} <= set(stepped)
    assert not torch.equal(stepped["/shard_state/param"], before["/shard_state/param"])
    assert tensors(copy).keys() == before.keys()
    assert all(torch.equal(t, before[k]) for k, t in tensors(copy).items())
    assert copy["dedup"] is not live["dedup"] and copy["controller"]["clocks"] is not live["controller"]["clocks"]

    again = detached(svc.state_dict(), copy)  # the next checkpoint's copy goes into the last one's tensors
    assert again["shard_state"]["param"] is copy["shard_state"]["param"]
    assert again["shard_state"]["param"] is not svc.shard.param.data
    assert all(torch.equal(t, stepped[k]) for k, t in tensors(again).items())


@pytest.mark.timeout(60)
def test_pushes_are_answered_while_a_checkpoint_is_written_and_it_holds_the_state_it_was_taken_at(
        tmp_path, monkeypatch):
    monkeypatch.setenv(PACE_ENV, str(PACE))
    svc = async_shard(tmp_path)
    for seq in range(3, 6):
        push(svc, seq, 1.0)
    taken_at, weights = svc.shard.version, svc.shard.weights.clone()
    momentum = svc.shard.optimizer.state_dict()["state"][0]["momentum_buffer"].clone()

    # this write lasts about 8 s, long enough for 10 pushes on a starved host: at 2 s, beside two busy loops and
    # three pytest processes, it once ended before they were answered
    svc.checkpoints.checkpointer.bytes_per_s = PACE / 4
    started = time.perf_counter()
    assert svc.checkpoints.start()
    copied = time.perf_counter() - started
    assert svc.checkpoints.writer.writing and not svc.checkpoints.start()  # one write in flight, no second one
    latencies = [push(svc, seq, 2.0) for seq in range(6, 16)]
    assert svc.checkpoints.writer.writing, "the write ended before the pushes: pace it slower to test anything"
    svc.checkpoints.writer.wait(30)
    svc.checkpoints.checkpointer.bytes_per_s = PACE  # the later writes: about 2 s each
    written = time.perf_counter() - started
    print(f"\ncopy on the loop {copied * 1e3:.1f} ms, write {written:.2f} s, push latency during it: "
          f"max {max(latencies) * 1e3:.1f} ms")
    assert max(latencies) < written / 4 and copied < written / 4

    state = read_verified(checkpoint_path(tmp_path, shard=0, num_shards=1))["shard_state"]
    assert state["version"] == taken_at == 3 and svc.shard.version == 13
    assert torch.equal(state["param"], weights)  # the copy of that moment, not the tensors stepped on since
    assert torch.equal(state["optimizer"]["state"][0]["momentum_buffer"], momentum)
    assert svc.summary()["checkpoints"] == 1 and svc.summary()["checkpoint_version"] == 3

    push(svc, 16, 3.0)
    assert svc.checkpoints.start() and svc.checkpoints.writer.writing  # version 14 in flight, then the final one:
    assert svc.checkpoints.save() is not None and not svc.checkpoints.writer.writing  # it waited for the one in flight
    assert read_verified(checkpoint_path(tmp_path, shard=0, num_shards=1))["shard_state"]["version"] == 14
    assert svc.summary()["checkpoints"] == 3


@pytest.mark.timeout(180)
def test_kill_9_in_the_middle_of_a_write_resumes_from_the_previous_checkpoint(procs, tmp_path, monkeypatch):
    """psrv serve with checkpoints every 0.5 s, each paced to last about 2 s; a client pushes until a
    write is in flight after a complete one, then the server is killed: --resume loads the complete one."""
    from psrv.client.psclient import PSClient
    monkeypatch.setenv(PACE_ENV, str(PACE))
    ckpt = tmp_path / "ck"
    path = checkpoint_path(ckpt, shard=0, num_shards=1)
    serve = ("--workers", "1", "--mode", "async", "--optimizer", "sgd", "--momentum", "0.9",
             "--checkpoint-dir", str(ckpt), "--worker-timeout", "60")
    server, address = procs.server("server", *serve, "--checkpoint-every", "0.5")
    plan = PartitionPlan((ParamSpec("w", (SIZE,)),), 1)
    in_flight, latencies = [], []
    with PSClient([address], plan, worker=0, world_size=1, timeout=30) as client:
        client.hello()
        client.init(torch.zeros(SIZE))
        deadline = time.monotonic() + 90
        while not (path.exists() and (in_flight := list(ckpt.glob(f".{path.name}.*.tmp")))):
            assert time.monotonic() < deadline and server.poll() is None, procs.log("server")
            started = time.perf_counter()
            client.push(torch.ones(SIZE), clock=0)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.05)
        during = []
        for _ in range(5):  # pushes while that write is in flight, each answered at once
            started = time.perf_counter()
            client.push(torch.ones(SIZE), clock=0)
            during.append(time.perf_counter() - started)
        stats = admin_request(address, MsgType.STATS, timeout=20)
        assert stats["checkpoint_writing"], "the write ended before the kill: pace it slower"
        os.kill(server.pid, signal.SIGKILL)
        server.wait(30)
    print(f"\nkilled at version {stats['version']} mid-write; push latency during the write: "
          f"max {max(during) * 1e3:.1f} ms")
    assert max(during) < 1.0   # a write lasts about 2 s; a push waiting for it would take that long
    assert all(p.exists() for p in in_flight), "the torn temporary file of the write that was killed"
    previous = read_verified(path)["shard_state"]["version"]  # whole: the checksum matches
    assert previous == stats["checkpoint_version"] < stats["version"]

    back, address = procs.server("resumed", *serve, "--resume")
    resumed = admin_request(address, MsgType.STATS, timeout=20)
    assert resumed["resumed_from"] == resumed["version"] == previous
    back.send_signal(signal.SIGTERM)
    assert procs.wait(back, timeout=60) == 0, procs.log("resumed")
