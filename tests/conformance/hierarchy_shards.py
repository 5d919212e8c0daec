"""The shards of the hierarchy's conformance cases (test_hierarchy.py against the reference, test_hierarchy_link.py
on the link's failure paths): psrv.Server threads on 127.0.0.1, a global shard and regional ones, and what waits
on them."""
from __future__ import annotations

import time

import pytest
import torch

from psrv.client.psclient import PSClient
from psrv.config import OptimConfig, ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.server.hierarchy import upstream
from psrv.server.run import Server

SIZE = 12
PLAN = PartitionPlan((ParamSpec("w", (SIZE,), "float32"),), 1)


def cluster(regions: int, every: int, local: OptimConfig, *, global_lr: float, global_momentum: float):
    top = Server(ServerConfig(mode="async", workers=regions,
                              optimizer=OptimConfig(name="sgd", lr=global_lr, momentum=global_momentum)))
    top.start()
    below = []
    for r in range(regions):
        s = Server(ServerConfig(mode="async", workers=1, first_rank=r, world_size=regions, upstream=top.address,
                                upstream_every=every, region=r, upstream_world=regions, optimizer=local))
        s.start()
        below.append(s)
    return top, below



def merged(shard: Server, syncs: int, timeout: float = 20.0) -> None:
    """Wait until `shard` has sent `syncs` syncs and merged the last."""
    up = shard._service.upstream
    deadline = time.monotonic() + timeout
    while not (up.syncs >= syncs and up.sent is None and up.joined):
        assert time.monotonic() < deadline, f"sync {syncs} not merged in {timeout}s"
        time.sleep(0.005)


def wait_for_link(shard: Server, timeout: float = 20.0) -> upstream.Link:
    deadline = time.monotonic() + timeout
    while shard._service.upstream.link is None:
        assert time.monotonic() < deadline, "the regional shard never started its link"
        time.sleep(0.005)
    return shard._service.upstream.link


def region0(top_address: str, **fields) -> Server:
    return Server(ServerConfig(**{"mode": "async", "workers": 1, "upstream": top_address, "upstream_every": 1,
                                  "region": 0, "upstream_world": 2, **fields}))


def init_region0(shard: Server) -> PSClient:
    c = PSClient([shard.address], PLAN, worker=0, world_size=1)
    c.hello()
    c.init(torch.zeros(SIZE))  # region 0's shard joins its global shard once it has weights
    return c


def stopped(shard: Server) -> str:
    """Region 0's `shard` started, given its weights and left by its worker: the line it stopped with."""
    shard.start()
    c = init_region0(shard)
    try:
        c.leave()
        with pytest.raises(upstream.UpstreamError) as err:
            shard.join()
    finally:
        c.close()
        shard.close()
    return str(err.value)
