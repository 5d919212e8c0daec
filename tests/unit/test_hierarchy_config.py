"""What --regions combines with (psrv/config/hierarchy.py): each refusal one line, naming the setting."""
from __future__ import annotations

import pytest

from psrv.config import ConfigError, RunConfig, ServerConfig, from_dict
from psrv.config.hierarchy import ranks_of, region_of


def _run(**tree) -> RunConfig:
    base = {"mode": "async", "cluster": {"workers": 4}, "hierarchy": {"regions": 2}}
    for key, value in tree.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return from_dict(RunConfig, base)


def test_regions_are_contiguous_blocks_of_ranks():
    assert [region_of(r, 5, 2) for r in range(5)] == [0, 0, 0, 1, 1]
    assert [list(ranks_of(g, 5, 2)) for g in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(ranks_of(g, 4, 4)) for g in range(4)] == [[0], [1], [2], [3]]


@pytest.mark.parametrize("tree,key", [
    ({"mode": "sync"}, "hierarchy.regions"),
    ({"hierarchy": {"regions": 5}}, "hierarchy.regions"),
    ({"cluster": {"replicas": 1}}, "cluster.replicas"),
    ({"cluster": {"transport": "rpc"}}, "cluster.transport"),
    ({"worker": {"compress_pull": "topk:0.1"}}, "worker.compress_pull"),
    ({"checkpoints": {"every": 5.0}}, "checkpoints.every"),
    ({"kill": {"worker": "1:5"}}, "kill.worker"),
    ({"kill": {"server": "0:5"}}, "kill.server"),
    ({"nemesis": {"schedule": "pause worker:1 at 1s for 1s"}}, "nemesis.schedule"),
    ({"mode": "ddp"}, "hierarchy.regions"),
    ({"hierarchy": {"regions": 1, "region_every": 5}}, "hierarchy.region_every"),
    ({"hierarchy": {"regions": 1, "global_lr": 0.5}}, "hierarchy.global_lr"),
    ({"hierarchy": {"region_every": 0, "global_momentum": 0.9}}, "hierarchy.global_momentum"),
])
def test_what_regional_shards_do_not_carry_is_refused(tree, key):
    with pytest.raises(ConfigError) as err:
        _run(**tree)
    assert err.value.key == key and "\n" not in str(err.value)


def test_a_flat_run_on_regions_takes_any_mode():
    assert _run(mode="sync", hierarchy={"region_every": 0}).hierarchy.tiered is False
    assert _run().hierarchy.tiered is True


@pytest.mark.parametrize("fields,key", [
    ({"upstream": "tcp://127.0.0.1:5555", "mode": "sync"}, "mode"),
    ({"upstream": "nowhere"}, "upstream"),
    ({"upstream": "ipc:///tmp/global"}, "upstream"),  # the link to a global shard is tcp
    ({"upstream": "tcp://127.0.0.1:5555", "checkpoint_dir": "/tmp/x"}, "checkpoint_dir"),
    ({"first_rank": 3, "workers": 2, "world_size": 4}, "first_rank"),
    ({"region": 2, "upstream_world": 2}, "region"),
])
def test_a_regional_shard_refuses_what_it_does_not_carry(fields, key):
    with pytest.raises(ConfigError) as err:
        ServerConfig(**{"mode": "async", **fields})
    assert err.value.key == key
