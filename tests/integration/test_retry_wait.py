"""A client's first probe of an unanswered request waits at least twice its recent round trips (a large
message on a slow link may still be on the wire), but the time a shard held a request on purpose, a sync
barrier waiting for a slower worker, is not the link's: counted in, one slow clock made every later lost
request wait seconds before its probe (a sync run with lost messages took 160 s instead of 20 under load)."""
from __future__ import annotations

import time

import pytest
import torch

import psrv
from psrv.config import RunConfig, from_dict
from psrv.server.run import Server
from tests.helpers import each_rank_in_threads

HOLD = 1.5  # seconds rank 1 sleeps before each push: rank 0's pull waits that long at the barrier


@pytest.mark.timeout(60)
def test_a_barrier_wait_does_not_lengthen_the_wait_before_a_probe():
    cfg = from_dict(RunConfig, {"mode": "sync", "cluster": {"servers": 1, "workers": 2}})
    server = Server(cfg.server_config(0, bind="tcp://127.0.0.1:0")).start()
    recent, waited = {}, {}

    def work(rank: int) -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        ps = psrv.Worker(model, [server.address], rank=rank, world_size=2, timeout=30)
        for _ in range(2):
            if rank == 1:
                time.sleep(HOLD)
            model(torch.ones(2, 4)).sum().backward()
            info = ps.step()
            waited[rank] = max(waited.get(rank, 0.0), info.waited)
        recent[rank] = ps._client.recent_seconds
        ps.close()

    try:
        each_rank_in_threads(work, 2)
    finally:
        server.stop()
        server.join(10)
    assert waited[0] > HOLD / 2, f"rank 0 was not held at the barrier ({waited}): the test tests nothing"
    assert recent[0] < HOLD / 3, f"rank 0's recent round trip {recent[0]:.2f} s counts the barrier's {waited[0]:.2f} s"
