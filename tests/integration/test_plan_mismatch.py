"""A worker whose model differs from rank 0's is the one refused, by its own rank, whichever says HELLO first;
rank 0 is never blamed for coming second, and trains on without the refused rank (no barrier waits for it).
Two psrv.Worker threads against two psrv.Server shards in threads of this process (127.0.0.1, OS ports)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

import psrv
from psrv.config import RunConfig, from_dict
from psrv.partition import PartitionPlan
from psrv.protocol import ErrorCode, MsgType, decode
from psrv.server.run import Server
from psrv.client.psclient import PSClient
from psrv.client.roundtrip import PSError

SHARDS, STEPS = 2, 5


@pytest.fixture
def servers():
    """Two sync shards (psrv.Server) in threads of this process, for two workers."""
    cfg = from_dict(RunConfig, {"mode": "sync", "cluster": {"servers": SHARDS, "workers": 2},
                                "optimizer": {"lr": 0.1}})
    started = [Server(cfg.server_config(i, bind="tcp://127.0.0.1:0")).start() for i in range(SHARDS)]
    yield started
    for s in started:
        s.stop()
    for s in started:
        s.join(10)


@pytest.fixture
def shards(servers):
    return [s.address for s in servers]


def _model(outputs: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, outputs)


def _client(rank: int, model: torch.nn.Module, addresses: list[str]) -> PSClient:
    return PSClient(addresses, PartitionPlan.from_module(model, SHARDS), worker=rank, world_size=2, timeout=10,
                    heartbeat=False, shared_memory=False, bulk=False)


def _plan_hashes(addresses: list[str]) -> list:
    """Each shard's plan hash as its STATS says (None before any HELLO)."""
    probe = _client(0, _model(3), addresses)
    try:
        return [s["plan_hash"] for s in probe.stats()]
    finally:
        probe.close()


def _worker(rank: int, model: torch.nn.Module, addresses: list[str], outcome: dict) -> threading.Thread:
    """Rank `rank` in a thread: psrv.Worker(model), STEPS steps, close(); `outcome[rank]` its final
    weights, or the error it raised."""
    def work():
        try:
            ps = psrv.Worker(model, addresses, rank=rank, world_size=2, timeout=30)
            g = torch.Generator().manual_seed(rank)
            for _ in range(STEPS):
                model(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
                ps.step()
            ps.close()
            outcome[rank] = model.weight.detach().clone()
        except BaseException as exc:  # handed to the test
            outcome[rank] = exc
    thread = threading.Thread(target=work, name=f"rank-{rank}", daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(90)
@pytest.mark.parametrize("first", [1, 0], ids=["odd-rank-first", "rank-0-first"])
def test_the_rank_with_another_model_is_refused_by_name_whichever_comes_first(shards, first):
    outcome: dict = {}
    models = {0: _model(3), 1: _model(5)}  # rank 1: 25 parameters, rank 0: 15
    ours, other = (PartitionPlan.from_module(models[r], SHARDS).hash for r in (0, 1))
    started = time.monotonic()
    threads = [_worker(first, models[first], shards, outcome)]
    deadline = time.monotonic() + 30
    # its HELLO in first: rank 1's builds the shards on its plan until rank 0 comes; rank 0's settles it
    while _plan_hashes(shards) != [ours if first == 0 else other] * SHARDS:
        assert time.monotonic() < deadline and first not in outcome, outcome
        time.sleep(0.05)
    threads.append(_worker(1 - first, models[1 - first], shards, outcome))
    for t in threads:
        t.join(60)
    assert set(outcome) == {0, 1}, outcome

    refused = outcome[1]
    assert isinstance(refused, PSError) and refused.code is ErrorCode.PLAN_MISMATCH, refused
    message = str(refused)
    assert "rank 1's model differs from the one this shard serves (rank 0's)" in message, message
    assert "25 parameters against 15" in message and "'weight' has shape [5, 4] against [3, 4]" in message
    assert other in message and ours in message and "\n" not in message

    trained = outcome[0]  # rank 0 is not blamed: it trains its 5 steps alone, without waiting for rank 1
    assert isinstance(trained, torch.Tensor), trained
    assert not torch.equal(trained, _model(3).weight.detach())
    assert time.monotonic() - started < 30  # not the 120 s a never-joined rank would hold the barrier


@pytest.mark.timeout(60)
def test_a_refused_rank_raises_once_every_shard_has_answered_its_hello(servers):
    """A HELLO one shard refuses is raised only once every shard has answered it, so each has heard it and
    refuses the rank too (no barrier of theirs waits for it). Raised at the first refusal, a worker closes its
    sockets at once, and a HELLO not yet sent to a shard whose connection was still being made is dropped: that
    shard then waited --join-timeout (120 s) for the rank, in a loaded suite run. Here shard 0 takes rank 1's
    HELLO a second late (its loop held by the test), after shard 1 has refused it."""
    addresses = [s.address for s in servers]
    rank0 = _client(0, _model(3), addresses)
    rank0.hello()  # rank 0's plan is the shards'
    late = servers[0].service
    handle = late.handle

    def held(peer, frames) -> None:  # shard 0's loop thread
        msg = decode([bytes(memoryview(f)) for f in frames])
        if msg.type is MsgType.HELLO and msg.worker == 1:
            time.sleep(1.0)
        handle(peer, frames)
    late.handle = held
    rank1 = _client(1, _model(5), addresses)
    try:
        with pytest.raises(PSError) as refused:
            rank1.hello()
        assert refused.value.code is ErrorCode.PLAN_MISMATCH and refused.value.shard == 1, refused.value
        assert 1 in late.membership.plans.refused, "raised before shard 0 had heard the refused rank's HELLO"
    finally:
        rank1.close()
        rank0.close()
