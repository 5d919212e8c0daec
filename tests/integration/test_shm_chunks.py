"""Chunked pushes and INIT over the shared-memory plane (psrv/transport/shm.py) are bit for bit the
same as over the plain connection: a payload outside the worker's shared gradient is copied into a
push slot, and the chunks of one message (psrv/chunking.py) each keep their own slot until the shard
has read them, so no chunk overwrites another one the shard has yet to read."""
from __future__ import annotations

import threading

import pytest
import torch

from psrv.client.psclient import PSClient
from psrv.config import OptimConfig, ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.server.run import Server

SIZE = 1 << 19  # floats: 2 MB, so 8 chunks of float32 and 4 of bfloat16, each over the plane's smallest payload
CHUNK_MB = 0.25
LR = 0.5


def _values() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Small integers: every weight along the way is a multiple of LR, exact in float32 and each gradient
    exact in bfloat16, so each push's own effect (the difference it makes) can be checked on its own."""
    gen = torch.Generator().manual_seed(3)
    init = torch.randint(-64, 64, (SIZE,), generator=gen).float()
    return init, [torch.randint(-8, 8, (SIZE,), generator=gen).float() for _ in range(3)]


def _run(shared_memory: bool, wire_dtype: str) -> tuple[list[torch.Tensor], dict]:
    """INIT from a plain tensor, then three push_pulls of plain tensors (not the shared gradient); the
    weights after each, and the shard's payload_bytes."""
    cfg = ServerConfig(workers=1, mode="async", bind="tcp://127.0.0.1:0", worker_timeout=30.0,
                       optimizer=OptimConfig(name="sgd", lr=LR, momentum=0.0))
    server = Server(cfg).start()
    init, grads = _values()
    plan = PartitionPlan((ParamSpec("w", (SIZE,)),), 1)
    seen = []
    try:
        with PSClient([server.address], plan, worker=0, world_size=1, timeout=30, heartbeat=False,
                      shared_memory=shared_memory, push_chunk_mb=CHUNK_MB, wire_dtype=wire_dtype) as client:
            client.hello()
            assert client.chunked, "the shard takes chunks"
            client.init(init)
            weights = torch.empty(SIZE)
            client.pull(clock=0, out=weights)
            seen.append(weights.clone())
            for clock, grad in enumerate(grads):
                client.push_pull(grad, clock=clock, out=weights)
                seen.append(weights.clone())
            client.leave()
    finally:
        server.stop()
    return seen, server.join(10)["payload_bytes"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
def test_init_and_pushes_in_chunks_over_shared_memory_equal_the_inline_run_bit_for_bit(wire_dtype):
    inline, inline_bytes = _run(False, wire_dtype)
    shm, shm_bytes = _run(True, wire_dtype)
    assert set(inline_bytes) == {"inline"} or inline_bytes.get("shm", 0) == 0, inline_bytes
    pushed = SIZE * (4 + 3 * torch.tensor([], dtype=getattr(torch, wire_dtype)).element_size())
    # INIT's and the pushes' chunks went by shared memory, two in flight at most per shard (PushSlots:
    # the others inline), and none was refused (stale) and re-sent: no byte moved twice
    assert shm_bytes["shm"] >= pushed / 2 and shm_bytes["shm"] + shm_bytes["inline"] == inline_bytes["inline"], (
        shm_bytes, inline_bytes)
    init, grads = _values()
    wrong = [] if torch.equal(shm[0], init) else [f"INIT off by {(shm[0] - init).abs().max().item():g}"]
    for c, grad in enumerate(grads):  # each push's effect on its own, whatever came before it
        step = shm[c + 1] - shm[c]
        if not torch.equal(step, -LR * grad):
            wrong.append(f"push {c} off by {(step + LR * grad).abs().max().item():g}")
    assert not wrong, ", ".join(wrong)
    for a, b in zip(inline, shm):
        assert torch.equal(a, b), f"max abs difference from the inline run {(a - b).abs().max().item():g}"


@pytest.mark.timeout(90)
def test_chunks_over_shared_memory_through_a_lossy_network_are_applied_once_and_exactly():
    """Chunk messages dropped and duplicated, replies dropped (test_faults.py's FaultyTransport around the
    shared-memory client): a duplicate's descriptor may name a slot that holds a later chunk by the time
    the shard takes it, which the shard refuses (RESET; the retry goes inline). Every push is applied
    once, with the values pushed: the weights are exactly sequential SGD's."""
    from psrv.server.service import ShardService
    from psrv.transport.shm import ShmClientPlane, ShmServerPlane
    from psrv.transport.zmq import ZmqClient, ZmqServer
    from tests.integration.test_faults import FaultyTransport
    cfg = ServerConfig(workers=1, mode="async", optimizer=OptimConfig(name="sgd", lr=LR, momentum=0.0))
    server = ZmqServer("tcp://127.0.0.1:0", planes=[ShmServerPlane()])
    service = ShardService(cfg, server)
    thread = threading.Thread(target=service.serve, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    plane = ShmClientPlane()
    net = FaultyTransport(ZmqClient([server.address], planes=[plane]), seed=5, drop=0.1, dup=0.2, drop_reply=0.1)
    init, grads = _values()
    grads = grads * 4
    try:
        with PSClient([server.address], PartitionPlan((ParamSpec("w", (SIZE,)),), 1), worker=0, world_size=1,
                      timeout=30, retry_interval=0.05, heartbeat=False, net=net, push_chunk_mb=CHUNK_MB) as client:
            client.hello()
            client.init(init)
            weights = torch.empty(SIZE)
            for clock, grad in enumerate(grads):
                client.push_pull(grad, clock=clock, out=weights)
            client.pull(clock=len(grads), out=weights, final=True)
            client.leave()
    finally:
        service.state.stopped = True
        thread.join(10)
        server.close()
    assert min(net.injected.values()) > 0, net.injected
    assert service.shard.version == len(grads)
    assert server.payload_bytes["shm"] > server.payload_bytes["inline"], server.payload_bytes
    want = init.clone()
    for grad in grads:
        want -= LR * grad
    assert torch.equal(weights, want), f"max abs difference {(weights - want).abs().max().item():g}"
