"""`psrv run --regions` (experiments/launcher/regions.py): regional shards under global ones, each region an
emulated host (--bandwidth) whose shards and workers talk over its own loopback, so only the syncs cross the
capped links; and the flat run on the same hosts (--region-every 0). Needs root and iproute2 (CI runs as root)."""
from __future__ import annotations

import math

import pytest

from tests.helpers import psrv_run
from tests.system.test_netns import _skip_unless_netns

pytestmark = [pytest.mark.root]
SAME = ("--workers", "4", "--regions", "2", "--mode", "async", "--steps", "30", "--lr", "0.01", "--bandwidth", "50mbit")


@pytest.mark.timeout(150)
def test_regions_sync_with_global_shards_and_only_the_syncs_cross_hosts(tmp_path):
    _skip_unless_netns()
    s = psrv_run(tmp_path / "tiers", *SAME, "--servers", "2", "--region-every", "5", "--global-lr", "0.8",
                 "--global-momentum", "0.5")
    h = s["hierarchy"]
    assert h["ranks"] == [[0, 1], [2, 3]] and h["region_every"] == 5 and h["global_momentum"] == 0.5
    # each sync is one update of its global shard; a regional shard (60 updates) syncs once 5 have come since its
    # last and none is in flight: fewer than 12 times where a sync outlasts 5 updates, never none
    assert sum(h["global_updates"]) == h["syncs"] and min(h["global_updates"]) >= 2
    assert s["num_servers"] == 4 and math.isfinite(s["final_loss"]) and s["final_loss"] < s["initial_loss"]
    hosts = s["network"]["hosts"]
    assert {hosts[f"global-{i}"]["namespace"] for i in range(2)} == {hosts["global-0"]["namespace"]}
    for rank, shard in ((0, 0), (1, 1), (2, 2), (3, 3)):  # rank w's host holds its region's shards
        region = rank // 2
        assert hosts[f"worker-{rank}"]["address"] == hosts[f"server-{2 * region}"]["address"]
    assert hosts["worker-0"]["address"] != hosts["worker-2"]["address"] != hosts["global-0"]["address"]
    # what left a region's host is its syncs (and their TCP's own bytes), not its workers' pushes and pulls
    pushed = 2 * 30 * 2 * 4 * 9_738  # two workers' 30 push-pulls of digits_mlp's float32 weights, each way
    assert hosts["worker-0"]["bytes_sent"] < pushed / 4


@pytest.mark.timeout(150)
def test_the_flat_run_on_the_same_hosts(tmp_path):
    _skip_unless_netns()
    s = psrv_run(tmp_path / "flat", *SAME, "--servers", "1", "--region-every", "0")
    assert "syncs" not in s["hierarchy"] and s["num_servers"] == 1
    hosts = s["network"]["hosts"]
    assert hosts["server-0"]["address"] not in {hosts[f"worker-{r}"]["address"] for r in range(4)}
    assert hosts["worker-0"]["address"] == hosts["worker-1"]["address"] != hosts["worker-2"]["address"]
    assert hosts["worker-0"]["bytes_sent"] > 30 * 4 * 9_738  # every push crossed the link
