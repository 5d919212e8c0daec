"""Partition plan: byte-balanced, deterministic, tensors may span shards, the hash tells plans apart."""
import pytest
import torch

from psrv.partition import ParamSpec, PartitionPlan


def plan(num_shards, shapes=((1000, 10), (10,), (3, 3))):
    return PartitionPlan(tuple(ParamSpec(f"p{i}", s) for i, s in enumerate(shapes)), num_shards)


@pytest.mark.parametrize("shards", [1, 2, 3, 7])
def test_ranges_cover_the_vector_contiguously_and_balanced(shards):
    p = plan(shards)
    ranges = p.ranges
    assert ranges[0][0] == 0 and ranges[-1][1] == p.total
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_a_large_tensor_spans_shards_and_pieces_add_up():
    p = plan(3)
    assert [name for name, *_ in p.pieces(0)] == ["p0"] and [n for n, *_ in p.pieces(1)] == ["p0"]
    covered = {}
    for s in range(3):
        for name, a, b in p.pieces(s):
            covered[name] = covered.get(name, 0) + (b - a)
    assert covered == {"p0": 10000, "p1": 10, "p2": 9}


def test_plan_is_deterministic_and_the_hash_sees_every_input():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    a, b = PartitionPlan.from_module(model, 2), PartitionPlan.from_module(model, 2)
    assert a == b and a.hash == b.hash
    assert a.hash != PartitionPlan.from_module(model, 3).hash
    assert a.hash != plan(2).hash
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 3))
    assert a.hash != PartitionPlan.from_module(other, 2).hash


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="num_shards"):
        plan(0)
    with pytest.raises(ValueError, match="cannot fill"):
        PartitionPlan((ParamSpec("a", (2,)),), 3)
    with pytest.raises(ValueError, match="float32"):
        PartitionPlan((ParamSpec("a", (2,), "float64"),), 1)
