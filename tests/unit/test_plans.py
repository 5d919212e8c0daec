"""Whose plan a shard keeps (psrv/server/membership/plans.py): rank 0's, which settles it whenever it comes; a rank that
said HELLO before it is refused then, by its rank, if its model differs, and one that matches is not."""
from __future__ import annotations

import pytest

from psrv.protocol import ErrorCode, ProtocolError
from psrv.server.membership.plans import Model, Plans

RANK0 = Model("h0", 15, (("weight", (3, 4)), ("bias", (3,))))
SAME = Model("h0", 15, RANK0.layout)
WIDER = Model("h1", 25, (("weight", (5, 4)), ("bias", (5,))))
RENAMED = Model("h2", 15, (("w", (3, 4)), ("bias", (3,))))
SHORTER = Model("h3", 12, (("weight", (3, 4)),))


def test_rank_0_settles_the_plan_and_refuses_only_the_ranks_that_differ():
    plans = Plans()
    assert plans.hello(2, WIDER, initialised=False).build  # the shard is built on rank 2's plan, on trial
    assert plans.hello(1, SAME, initialised=False) == (False, {})
    assert plans.hello(3, RENAMED, initialised=False) == (False, {})
    settled = plans.hello(0, RANK0, initialised=False)
    assert settled.build and sorted(settled.expelled) == [2, 3]  # rebuilt for rank 0's size; rank 1 kept
    assert "rank 2's model differs from the one this shard serves (rank 0's): 25 parameters against 15; " \
           "'weight' has shape [5, 4] against [3, 4] (partition plan h1, this shard's h0)" in str(settled.expelled[2])
    assert "parameter 0 is 'w' [3, 4] against 'weight' [3, 4]" in str(settled.expelled[3])
    with pytest.raises(ProtocolError) as err:  # settled: refused at once, by its rank
        plans.hello(4, SHORTER, initialised=False)
    assert err.value.code is ErrorCode.PLAN_MISMATCH
    assert "rank 4's model differs from the one this shard serves (rank 0's): 12 parameters against 15; " \
           "1 parameter tensors against 2: 'bias' is missing" in err.value.message
    assert sorted(plans.refused) == [2, 3, 4]  # their other requests get their refusal
    assert plans.hello(2, SAME, initialised=False) == (False, {})  # restarted with the right model: welcome
    assert sorted(plans.refused) == [3, 4]
    with pytest.raises(ProtocolError):  # a second process claiming a rank the shard heard from: that one goes on
        plans.hello(1, WIDER, initialised=False, heard=True)
    assert 1 not in plans.refused


def test_rank_0_with_the_trial_plan_keeps_the_shard_and_a_checkpoint_settles_it():
    plans = Plans()
    plans.hello(1, SAME, initialised=False)
    assert plans.hello(0, RANK0, initialised=False) == (False, {})
    resumed = Plans()
    resumed.resumed("h0")
    with pytest.raises(ProtocolError, match=r"rank 0's model differs from the one this shard serves \(resumed from "
                       r"a checkpoint\) \(partition plan h1, this shard's h0\)"):
        resumed.hello(0, WIDER, initialised=False)


def test_weights_already_in_fix_the_plan_even_for_rank_0():
    plans = Plans()
    plans.hello(1, WIDER, initialised=False)  # a tool's INIT from rank 1 then put weights of this size in
    with pytest.raises(ProtocolError, match="rank 0's model differs .*rank 1's"):
        plans.hello(0, RANK0, initialised=True)
