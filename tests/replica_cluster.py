"""Replicated shards in threads of the test process (tests/integration/test_replication.py and
test_replication_faults.py): shards as psrv.Server on 127.0.0.1, workers as psrv.Worker loops on a small model."""
from __future__ import annotations

import threading
import time

import torch

import psrv
from psrv.config import OptimConfig, ServerConfig

STEPS = 30


def shard(mode: str, *, workers: int, witness, backup_of: str = "", optimizer: str = "sgd",
           drop: int = 0, failure_bound: float = 1.0, worker_timeout: float = 30.0) -> psrv.Server:
    """`witness`: the shard's witness directory (tmp_path), which every replica of it is given."""
    optim = OptimConfig("sgd", lr=0.05, momentum=0.9) if optimizer == "sgd" else OptimConfig("adam", lr=1e-3)
    return psrv.Server(ServerConfig(workers=workers, mode=mode, optimizer=optim, backup_of=backup_of,
                                    witness=str(witness), failure_bound=failure_bound,
                                    worker_timeout=worker_timeout, staleness=1 if mode == "ssp" else 0,
                                    backup_workers=drop)).start()


def wait_for(what, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def following(server: psrv.Server) -> bool:
    follower = server.service.replication.follower
    return follower is not None and follower.following


def stall(server: psrv.Server, seconds: float) -> None:
    """Stop the shard's loop for `seconds` at its next receive, as SIGSTOP would: no ping, no answer, no ack."""
    service = server.service
    receive = service.transport.recv

    def stalled(timeout):
        service.transport.recv = receive
        time.sleep(seconds)
        return receive(timeout)
    service.transport.recv = stalled


def model() -> torch.nn.Module:
    """The workers' model, the same initial weights every time."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    init = torch.Generator().manual_seed(0)  # not the global RNG, which the other threads draw from too
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=init))
    return net


def train(address: str, rank: int, workers: int, steps: int, started: threading.Event | None = None,
           go: threading.Event | None = None, pull: str = "", fragments: int = 1) -> None:
    """`started`: set at a third of the steps; `go`: waited for then, if given; `pull`: --compress-pull;
    `fragments` > 1: streaming DiLoCo (an inner SGD step each step, a fragment pushed each step)."""
    net = model()
    gen = torch.Generator().manual_seed(100 + rank)
    inner = torch.optim.SGD(net.parameters(), lr=0.05) if fragments > 1 else None
    streaming = {"local_steps": fragments, "fragments": fragments} if fragments > 1 else {}
    with psrv.Worker(net, [address], rank=rank, world_size=workers, timeout=30.0, compress_pull=pull,
                     **streaming) as ps:
        for step in range(steps):
            x = torch.randn(16, 8, generator=gen)
            loss = ((net(x) - x.sum(1, keepdim=True)) ** 2).mean()
            net.zero_grad()
            loss.backward()
            if inner is not None:
                inner.step()
            ps.step()
            if started is not None and step == steps // 3:
                started.set()
                if go is not None:
                    assert go.wait(60)


def run_workers(address: str, workers: int, steps: int = STEPS, started: threading.Event | None = None,
         go: threading.Event | None = None, pull: str = "", fragments: int = 1) -> list[threading.Thread]:
    threads = [threading.Thread(target=train, args=(address, r, workers, steps, *((started, go) if r == 0 else
                                                                                 (None, None)), pull, fragments),
                                daemon=True) for r in range(workers)]
    for t in threads:
        t.start()
    return threads


def finish(threads: list[threading.Thread], go: threading.Event, *servers: psrv.Server) -> list[dict]:
    """Let the held workers go, wait for every one to end, then return each shard's summary, in order."""
    go.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), f"{t.name} still running"
    return [s.join(30) for s in servers]
