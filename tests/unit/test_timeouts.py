"""Every failover timeout from one failure bound (psrv/timeouts.py), and the order they must keep, checked where a
shard is replicated: a failover shorter than half the worker timeout, a request timeout longer than it."""
from __future__ import annotations

import pytest

from psrv.config import ConfigError, RunConfig, ServerConfig, from_dict
from psrv.timeouts import Timeouts


def test_each_timeout_derives_from_the_bound():
    t = Timeouts(1.0, 10.0)
    assert (t.ping_every, t.silence, t.ack_timeout, t.probe_after) == (0.1, 0.5, 1.0, 0.2)
    assert Timeouts(1.0, 10.0, transport_floor=5.0).silence == 5.0  # torch RPC's least silence
    assert "a failover (1.1s) < --worker-timeout / 2 (5s)" in t.line()


@pytest.mark.parametrize("more,message", [
    ({"server": {"failure_bound": 5.0}}, "failure_bound: --failure-bound 5s makes a failover take up to 5.5s"),
    ({"worker": {"request_timeout": 1.0}}, "failure_bound: --request-timeout 1s must exceed a failover \\(1.1s"),
])
def test_a_replicated_run_refuses_timeouts_out_of_order_in_one_line(more, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(RunConfig, {"cluster": {"replicas": 1}, **more})
    from_dict(RunConfig, more)  # without replicas no failover: nothing to order


def test_a_replicated_shard_checks_the_order_too():
    with pytest.raises(ConfigError, match="failure_bound: --failure-bound 5s"):
        from_dict(ServerConfig, {"witness": "w", "failure_bound": 5.0})
    assert from_dict(ServerConfig, {"failure_bound": 4.0}).timeouts().silence == 2.0
