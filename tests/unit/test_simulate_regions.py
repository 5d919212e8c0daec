"""The simulator's hierarchy (experiments/simulate/regions.py): syncs laid over the regional shards' update
times, checked by hand; a region's cluster is the flat cluster of its ranks; what is not simulated is refused."""
from __future__ import annotations

import pytest

from psrv.config import ConfigError, from_dict
from psrv.experiments.simulate import regions
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.run import simulate


def test_one_region_s_syncs_by_hand():
    # a transfer of 0.1 s each way (64 header + 9,936 bytes at 100 kB/s), 0.5 s latency each way, 0.2 s to apply
    got = regions.syncs([[[1.0, 2.0, 3.0, 4.0, 5.0]]], every=2, slice_bytes=[9_936.0], latency=0.5,
                        bandwidth=100_000.0, server_seconds=0.2)
    # leaves at 2 (2 updates), back at 2 + 0.5 + 0.1 + 0.2 + 0.1 + 0.5 = 3.4; at 4 (updates 3, 4), back 5.4; then
    # the last update (5) at 5.4, back 6.8
    assert got["syncs"] == 3 and got["global_updates"] == [3] and got["syncs_end_seconds"] == pytest.approx(6.8)
    assert got["sync_bytes"] == 3 * 2 * 10_000.0 and got["mean_sync_seconds"] == pytest.approx(1.4)


def test_two_regions_queue_on_the_global_shard_s_link():
    # both leave at 1.0: the second waits for the first's transfer in (1 s) and its step (1 s) before its own
    got = regions.syncs([[[1.0]], [[1.0]]], every=1, slice_bytes=[9_936.0], latency=0.0, bandwidth=10_000.0,
                        server_seconds=1.0)
    # first: in 1..2, step 2..3, out 3..4; second: in 2..3, step 3..4, out 4..5
    assert got["syncs"] == 2 and got["syncs_end_seconds"] == pytest.approx(5.0)
    assert got["mean_sync_seconds"] == pytest.approx((3.0 + 4.0) / 2)


def _cfg(**tree) -> SimulationConfig:
    return from_dict(SimulationConfig, {"mode": "async", "job": {"steps": 30}, "faults": {"compute_ms": 20.0},
                                        "cluster": {"workers": 8, "servers": 2}, **tree})


def test_each_region_runs_as_the_flat_cluster_of_its_ranks():
    tiered = simulate(_cfg(hierarchy={"regions": 2, "region_every": 5},
                           faults={"compute_ms": 20.0, "straggler": "5:3"}))
    alone = simulate(_cfg(cluster={"workers": 4, "servers": 2}, faults={"compute_ms": 20.0, "straggler": "1:3"}))
    # region 1 holds ranks 4..7, rank 5 the straggler: as rank 1 of a flat cluster of 4 (the same draws by rank)
    assert tiered["pushes"] == 8 * 30 and tiered["num_servers"] == 4
    assert tiered["updates_applied_per_shard"][2:] == alone["updates_applied_per_shard"]
    assert tiered["wall_seconds"] == pytest.approx(alone["wall_seconds"])  # the straggler's region ends last
    h = tiered["hierarchy"]
    assert h["regions"] == 2 and h["syncs"] == sum(h["global_updates"]) and min(h["global_updates"]) >= 2
    assert h["syncs_end_seconds"] > tiered["wall_seconds"]  # the last syncs come back after the last step


@pytest.mark.parametrize("tree,key", [
    ({"hierarchy": {"regions": 2}, "simulate": {"level": "learning"}}, "simulate.level"),
    ({"hierarchy": {"regions": 2}, "simulate": {"fail_mtbf": 5.0}}, "simulate.fail_mtbf"),
    ({"simulate": {"region_latency_ms": 5.0}}, "simulate.region_latency_ms"),
    ({"hierarchy": {"regions": 2, "global_lr": 0.5}}, "hierarchy.global_lr"),
])
def test_what_the_hierarchy_does_not_simulate_is_refused(tree, key):
    with pytest.raises(ConfigError) as err:
        _cfg(**tree)
    assert err.value.key == key
