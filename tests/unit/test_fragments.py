"""Streaming DiLoCo's fragments, both ends: the worker's strided layout (psrv/client/fragments.py) and the
shard's per-fragment steps and refusals (psrv/server/fragments.py), on known tensors, no processes."""
from __future__ import annotations

import pytest
import torch

from psrv.config import OptimConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import ErrorCode, Message, MsgType, ProtocolError
from psrv.server.fragments import FragmentShards, fragment_key
from psrv.server.rules import PushContext
from psrv.server.shard import Shard
from psrv.client.fragments import Fragments

# tensors of 6, 2, 4, 3 and 5 elements: flat [0, 6) [6, 8) [8, 12) [12, 15) [15, 20); two shards [0, 10) [10, 20)
PLAN = PartitionPlan(tuple(ParamSpec(n, (k,)) for n, k in zip("abcde", (6, 2, 4, 3, 5))), 2)


def test_fragment_f_holds_tensors_f_f_plus_F_and_so_on_whole():
    frags = Fragments(PLAN, 2)
    assert frags.ranges == [[(0, 6), (8, 12), (15, 20)], [(6, 8), (12, 15)]]
    assert frags.numel == [15, 5]
    assert [frags.shard_ranges(0, s) for s in (0, 1)] == [[[0, 6], [8, 10]], [[0, 2], [5, 10]]]
    assert [frags.shard_ranges(1, s) for s in (0, 1)] == [[[6, 8]], [[2, 5]]]
    assert frags.bounds[0] == [(0, 8), (8, 15)]
    flat = torch.arange(20.0)
    gathered = frags.gather(0, flat)
    assert gathered.tolist() == [0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 15, 16, 17, 18, 19]
    frags.scatter(0, -gathered, flat)
    assert flat.tolist() == [-v if v in gathered.tolist() else v for v in range(20)]
    assert Fragments(PLAN, 1).ranges == [[(0, 20)]]  # one fragment: the whole vector in one range
    with pytest.raises(ValueError, match=r"^fragments must be in 1\.\.5"):
        Fragments(PLAN, 6)


@pytest.mark.parametrize("ranges", [[[0, 4], [3, 6]], [[4, 6], [0, 2]], [[0, 11]], [[2, 2]], [[0, True]], "0-4", [[0]]])
def test_a_fragment_must_be_sorted_disjoint_ranges_within_the_shard(ranges):
    with pytest.raises(ProtocolError) as err:
        fragment_key(Message(MsgType.PUSH, fields={"fragment": ranges}), 10)
    assert err.value.code is ErrorCode.MALFORMED


def test_a_fragment_push_goes_whole_and_a_plain_one_names_none():
    assert fragment_key(Message(MsgType.PUSH, fields={}), 10) is None
    assert fragment_key(Message(MsgType.PUSH, fields={"fragment": [[0, 2], [5, 10]]}), 10) == ((0, 2), (5, 10))
    with pytest.raises(ProtocolError, match="goes whole"):
        fragment_key(Message(MsgType.PUSH, fields={"fragment": [[0, 2]], "chunk": [0, 2]}), 10)


def _shard() -> Shard:
    shard = Shard(10, OptimConfig(name="sgd", lr=0.5, momentum=0.9, nesterov=True))
    shard.init(torch.arange(10.0))
    return shard


def test_a_fragment_steps_its_own_elements_with_its_own_momentum():
    shard, frags = _shard(), FragmentShards()
    a, b = ((0, 2), (5, 7)), ((2, 5),)
    ctx = PushContext(0, 0, 0, 0)
    frags.apply(shard, a, torch.ones(4), ctx)       # momentum 1 -> step 0.5 * (1 + 0.9 * 1)
    frags.apply(shard, b, torch.ones(3), ctx)
    frags.apply(shard, a, torch.ones(4), ctx)       # a's momentum 1.9 -> 0.5 * (1 + 0.9 * 1.9); b's is its own
    w = shard.weights.tolist()
    first, second = 0.5 * 1.9, 0.5 * (1 + 0.9 * 1.9)
    assert w[0] == pytest.approx(0 - first - second) and w[6] == pytest.approx(6 - first - second)
    assert w[3] == pytest.approx(3 - first) and w[7:] == [7.0, 8.0, 9.0]  # outside every fragment: untouched
    assert shard.version == 3 and torch.cat([shard.weights[x:y] for x, y in b]).tolist() == pytest.approx([2 - first, 3 - first, 4 - first])


def test_a_sync_clock_takes_one_fragment_only():
    shard, frags = _shard(), FragmentShards()
    frags.accumulate(shard, ((0, 2),), torch.ones(2), merge=False, weight=1)
    for wrong in (lambda: frags.accumulate(shard, ((2, 4),), torch.ones(2), merge=False, weight=1),
                  frags.check_whole):
        with pytest.raises(ProtocolError) as err:
            wrong()
        assert err.value.code is ErrorCode.NOT_ALLOWED
    frags.accumulate(shard, ((0, 2),), 3 * torch.ones(2), merge=False, weight=1)
    assert frags.accumulated == 2 and frags.apply_accumulated(shard) == [2]  # the mean 2: Nesterov's 0.5 (2 + 0.9 * 2)
    assert shard.weights[:3].tolist() == pytest.approx([-1.9, -0.9, 2.0]) and frags.open == []
    assert shard.version == 1
