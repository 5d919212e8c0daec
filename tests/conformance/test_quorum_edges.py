"""What the matrix's turns cannot show of sync's quorum (psrv/server/consistency/quorum.py), in the conformance
suite so that `make mutants` runs it: merges of Q distinct workers' pushes of any clock, every pull answered at
once, the age rule (no case's push is old enough), the grace window, the state through a checkpoint, the
degenerate cases against sync and async, and the config tree's refusals."""
import pytest

from psrv.config import ConfigError, RunConfig, from_dict
from psrv.server.consistency import (AsyncController, Decision, QuorumController, SyncController,
                                     make_controller)


def test_a_merge_closes_on_the_qth_distinct_worker_and_a_second_push_of_one_joins_it():
    c = QuorumController(3, quorum=2)
    assert c.push(0, 0) is Decision.ACCUMULATE and not c.commit_ready()
    assert c.push(0, 1) is Decision.ACCUMULATE and not c.commit_ready()  # worker 0 again: still one worker
    assert c.pull_ready(0, 2) and c.next_clock(0) == 2  # no wait; its own count of pushes
    assert c.push(2, 0) is Decision.ACCUMULATE and c.commit_ready()
    assert c.voided == set()
    c.committed()
    assert c.open_clock == 1 and not c.commit_ready() and c.arrived == set()


def test_pushes_of_any_clock_join_the_open_merge_where_sync_drops_them():
    q, s = QuorumController(2, quorum=2), SyncController(2)
    assert q.push(0, 5) is Decision.ACCUMULATE and s.push(0, 5) is Decision.DROP


def test_the_age_rule_drops_a_push_older_than_max_age_and_zero_keeps_every_push():
    c = QuorumController(2, quorum=2, max_age=2)
    assert c.push(0, 0, age=2) is Decision.ACCUMULATE
    assert c.push(1, 0, age=3) is Decision.DROP and not c.commit_ready()
    assert c.clocks[1] == 1  # a dropped push still counts as pushed: the worker goes on
    assert QuorumController(2, quorum=2).push(1, 0, age=10**6) is Decision.ACCUMULATE


def test_a_non_finite_push_fills_no_quorum_but_its_worker_arrived():
    c = QuorumController(3, quorum=2)
    c.push(0, 0)
    c.push(1, 0)
    c.void(1)
    assert not c.commit_ready() and c.voided == {1}  # 1's push carried nothing: the merge waits for 2 gradients
    c.push(1, 1)
    assert c.commit_ready() and c.voided == set()
    c.committed()
    c.push(0, 1)
    c.push(1, 2)
    c.void(1)
    c.push(2, 0)
    c.void(2)
    assert c.commit_ready()  # as sync's clock: every worker still pushing is in, with the gradients there are


def test_a_workers_non_finite_push_takes_back_only_itself_of_its_gradients_in_a_merge():
    c = QuorumController(3, quorum=2)
    c.push(0, 0)
    c.push(0, 1)
    c.void(0)  # its second push had no gradient: its first is still in the merge
    assert c.gradients[0] == 1 and not c.commit_ready()
    c.push(1, 0)
    assert c.commit_ready()


def test_fewer_pushing_than_q_merge_once_every_one_is_in():
    c = QuorumController(3, quorum=3)
    c.push(0, 0)
    c.push(1, 0)
    assert not c.commit_ready()
    c.leave(2)  # routed around: the merge no longer waits for it
    assert c.needed() == 2 and c.commit_ready()
    c.committed()
    c.push(0, 1)
    c.finish(1)
    assert c.commit_ready()  # the last merge, once the others finished


def test_quorum_one_is_async_step_for_step_and_quorum_n_of_one_worker_is_sync():
    """Degenerate cases: Q = 1 merges each push alone (async's steps, at the same ages); one worker at Q = 1
    is sync's barrier of one."""
    q, a = QuorumController(3, quorum=1), AsyncController(3)
    for w, clock in [(0, 0), (2, 0), (0, 1), (1, 0)]:
        assert q.push(w, clock) is Decision.ACCUMULATE and q.commit_ready()
        q.committed()
        assert a.push(w, clock) is Decision.APPLY
    assert q.open_clock == 4 and q.clocks == a.clocks
    one, sync = QuorumController(1, quorum=1), SyncController(1)
    for clock in range(3):
        one.push(0, clock), sync.push(0, clock)
        assert one.commit_ready() and sync.commit_ready()
        one.committed(), sync.committed()
    assert one.open_clock == sync.open_clock == 3


def test_a_grace_window_holds_a_met_merge_open_until_it_is_over_or_everyone_is_in():
    c = QuorumController(3, quorum=1, grace=True)
    c.push(0, 0)
    assert c.met() and not c.commit_ready()  # its Q workers are in; the window runs
    c.push(1, 0)
    assert not c.commit_ready()
    c.expire()
    assert c.commit_ready()
    c.committed()
    assert not c.due  # each merge has its own window
    for w in range(3):
        c.push(w, 1)
    assert c.commit_ready()  # everyone still pushing is in: no window to wait out


def test_state_round_trips_and_a_sync_checkpoint_is_refused():
    c = QuorumController(3, quorum=2, max_age=4)
    c.push(0, 0)
    c.push(1, 0)
    c.void(1)
    d = QuorumController(3, quorum=2, max_age=4)
    d.load_state_dict(c.state_dict())
    assert (d.arrived, d.voided, d.open_clock, d.clocks) == (c.arrived, c.voided, c.open_clock, c.clocks)
    g = QuorumController(3, quorum=1, grace=True)
    g.push(0, 0)
    g.expire()
    h = QuorumController(3, quorum=1, grace=True)
    h.load_state_dict(g.state_dict())
    assert h.due and h.commit_ready()
    with pytest.raises(ValueError, match="'sync' controller"):
        d.load_state_dict(SyncController(3).state_dict())


def test_each_part_has_its_merge_and_the_state_is_the_same_whichever_part_is_selected():
    """Merges per fragment (`part`): a push to part 8 does not fill part 0's quorum; a worker leaving completes
    a parked merge; the saved state holds every open merge, alike whichever one is selected (a backup's equals
    its primary's), and a state saved before parts (one merge) loads as part None's."""
    c = QuorumController(3, quorum=2)
    c.push(0, 0, part=0)
    c.push(1, 0, part=8)
    assert not c.commit_ready() and c.parts() == [8, 0]
    c.select(0)
    assert not c.commit_ready() and c.arrived == {0}
    saved = c.state_dict()
    c.select(8)
    assert c.state_dict() == saved
    d = QuorumController(3, quorum=2)
    d.load_state_dict(saved)
    assert sorted(d.parts(), key=str) == [0, 8, None] and d.state_dict() == saved
    d.select(0)
    assert not d.commit_ready()  # the loaded merge counts one worker still pushing, of two needed
    d.push(2, 1, part=0)
    assert d.commit_ready()
    c.push(2, 1, part=0)
    assert c.commit_ready() and c.part == 0  # workers 0 and 2 in part 0's merge
    c.committed()
    c.leave(2)
    c.leave(0)  # one worker still pushing: part 8's merge holds it
    c.select(8)
    assert c.commit_ready()
    old = {**QuorumController(3, quorum=2).state_dict(), "arrived": [1], "gradients": {"1": 1}, "due": False}
    del old["merges"]
    e = QuorumController(3, quorum=2)
    e.load_state_dict(old)
    assert (e.part, e.arrived, e.gradients[1]) == (None, {1}, 1)


def test_make_controller_builds_it_only_for_sync_with_a_quorum():
    assert isinstance(make_controller("sync", 2, quorum=2), QuorumController)
    assert isinstance(make_controller("sync", 2), SyncController)
    with pytest.raises(ValueError, match="quorum must be in"):
        QuorumController(2, quorum=3)
    with pytest.raises(ValueError, match="max_age must be >= 0; got -1"):
        QuorumController(2, quorum=1, max_age=-1)


@pytest.mark.parametrize("tree, key", [
    ({"mode": "async", "quorum": 1}, "quorum"),
    ({"mode": "sync", "quorum": 1, "backup_workers": 1}, "quorum"),
    ({"mode": "sync", "quorum_max_age": 2}, "quorum_max_age"),
    ({"mode": "sync", "quorum_grace": 0.5}, "quorum_grace"),
    ({"mode": "sync", "quorum": 1, "quorum_grace_adaptive": True}, "quorum_grace_adaptive"),
    ({"mode": "sync", "quorum": 5}, "quorum"),
    ({"mode": "sync", "quorum": 2, "optimizer": {"name": "onebit_adam", "freeze_step": 2}},
     "optimizer.name"),
])
def test_the_config_tree_refuses_a_quorum_where_it_does_nothing_or_is_not_built(tree, key):
    with pytest.raises(ConfigError) as err:
        from_dict(RunConfig, {"cluster": {"workers": 4}, **tree})
    assert err.value.key == key


def test_a_quorum_config_is_accepted_and_stored():
    cfg = from_dict(RunConfig, {"mode": "sync", "quorum": 3, "quorum_max_age": 4, "cluster": {"workers": 4}})
    assert (cfg.quorum, cfg.quorum_max_age) == (3, 4)
    streaming = from_dict(RunConfig, {"mode": "sync", "quorum": 2, "cluster": {"workers": 4},
                                      "worker": {"local_steps": 4, "fragments": 2}})  # Decoupled DiLoCo's setting
    assert (streaming.quorum, streaming.worker.fragments) == (2, 2)
