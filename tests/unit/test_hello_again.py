"""A worker its shard has forgotten (dropped after silence, or left) says HELLO again inside the round
trip that was refused, and that round trip then ends: the push is applied once and answered. The HELLO
said again carries the round trip's seq; with seq 0 its WELCOME was dropped as a stale reply, the shard's
answers to the probes kept the round trip alive, and the worker hung without end."""
from __future__ import annotations

import time

import pytest
import torch

from psrv.config import ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from tests.inproc import InProcess

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_a_forgotten_worker_says_hello_again_and_its_push_is_applied_once(mode):
    cluster = InProcess([ServerConfig(shard=0, num_shards=1, workers=2, mode=mode, staleness=4)])
    client = cluster.client(0, PartitionPlan((ParamSpec("w", (8,)),), 1))
    client.timeout, client.retry_interval = 4.0, 0.2
    client.hello()
    client.init(torch.zeros(8))
    client.pull(clock=0, out=torch.empty(8))
    service = cluster.services[0]
    service.state.liveness.left.add(0)
    service.membership.remove(0, what="lost")  # the shard forgets worker 0, as after its silence
    started = time.monotonic()
    client.push(torch.ones(8), clock=0)
    assert time.monotonic() - started < 2.0                 # answered, not held to the timeout
    assert service.shard.version == 1 and 0 in service.controller.active
    out = torch.empty(8)
    client.pull(clock=1, out=out)
    assert not torch.equal(out, torch.zeros(8))             # the one push moved the weights
