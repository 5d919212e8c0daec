"""Consistency controllers as pure state machines: no sockets, no tensors, no clocks but their own."""
import pytest

from psrv.server.consistency import Decision, make_controller


def test_sync_buffers_a_clock_until_every_worker_pushed_then_commits_once():
    c = make_controller("sync", 3)
    assert c.push(0, 0) is Decision.ACCUMULATE and not c.commit_ready()
    assert c.push(1, 0) is Decision.ACCUMULATE and not c.commit_ready()
    assert not c.pull_ready(0, 1)                      # clock 1 weights don't exist yet
    assert c.push(2, 0) is Decision.ACCUMULATE and c.commit_ready()
    c.committed()
    assert c.open_clock == 1 and c.pull_ready(0, 1) and not c.pull_ready(0, 2)


def test_sync_drops_late_duplicate_and_future_gradients():
    c = make_controller("sync", 2)
    c.push(0, 0)
    assert c.push(0, 0) is Decision.DROP               # same worker twice in one clock
    assert c.push(1, 1) is Decision.DROP               # a clock that is not open
    c.push(1, 0)
    c.committed()
    assert c.push(0, 0) is Decision.DROP               # late: clock 0 is finished


def test_sync_with_backup_workers_commits_on_n_minus_b():
    c = make_controller("sync", 4, backup_workers=1)
    for w in (0, 1):
        c.push(w, 0)
    assert not c.commit_ready()
    c.push(3, 0)
    assert c.commit_ready()
    c.committed()
    assert c.push(2, 0) is Decision.DROP               # the straggler's gradient came too late
    assert c.next_clock(2) == 1                        # and it is told to continue at the open clock


def test_sync_a_worker_that_pushed_then_left_does_not_close_the_clock_for_the_others():
    c = make_controller("sync", 3)
    c.push(0, 0)
    c.leave(0)                                         # e.g. interrupted right after its push
    assert not c.commit_ready()                        # workers 1 and 2 have not pushed clock 0 yet
    c.push(1, 0)
    assert not c.commit_ready()
    assert c.push(2, 0) is Decision.ACCUMULATE and c.commit_ready()   # 2's gradient is not dropped as late
    c.committed()
    assert c.open_clock == 1


def test_sync_barrier_does_not_wait_for_a_worker_that_left():
    c = make_controller("sync", 3)
    c.push(0, 0)
    c.push(1, 0)
    assert not c.commit_ready()
    c.leave(2)
    assert c.commit_ready()


def test_async_applies_every_push_and_answers_every_pull():
    c = make_controller("async", 2)
    assert all(c.push(0, k) is Decision.APPLY for k in range(10))
    assert c.pull_ready(0, 10) and c.clock_gap(10) == 10   # worker 1 never pushed: async has no bound


@pytest.mark.parametrize("s", [0, 1, 3])
def test_ssp_never_answers_a_pull_more_than_s_clocks_ahead_of_the_slowest(s):
    c = make_controller("ssp", 2, staleness=s)
    clock = 0
    while c.pull_ready(0, clock):                      # worker 0 runs alone; worker 1 is stuck at 0
        assert c.clock_gap(clock) <= s
        assert c.push(0, clock) is Decision.APPLY
        clock += 1
    assert clock == s + 1                              # it got exactly s clocks ahead, then blocked
    c.push(1, 0)                                       # the slow worker moves one clock
    assert c.pull_ready(0, clock) and c.clock_gap(clock) == s


def test_ssp_slowest_worker_leaving_releases_the_others():
    c = make_controller("ssp", 3, staleness=0)
    c.push(0, 0)
    c.push(1, 0)
    assert not c.pull_ready(0, 1)
    c.leave(2)
    assert c.pull_ready(0, 1)


def test_unknown_mode_and_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="mode"):
        make_controller("bsp", 2)
    with pytest.raises(ValueError, match="staleness"):
        make_controller("ssp", 2, staleness=-1)
    with pytest.raises(ValueError, match="backup_workers"):
        make_controller("sync", 2, backup_workers=2)


@pytest.mark.parametrize("seed", range(5))
def test_the_slowest_clock_is_kept_right_through_pushes_joins_and_leaves(seed):
    import random
    rng = random.Random(seed)
    c = make_controller("ssp", 8, staleness=2)
    for _ in range(2000):
        w, r = rng.randrange(8), rng.random()
        if r < 0.05:
            c.leave(w)
        elif r < 0.1:
            c.join(w)
        elif w in c.active:
            c.push(w, c.clocks[w] + rng.choice([0, 0, 1, 3]) - 1)   # repeats, steps and jumps
        assert c.min_clock() == min((c.clocks[a] for a in c.active), default=0)


# --- a worker that (re)joins a sync run under way ---------------------------------------------
def test_sync_a_rejoiner_is_not_waited_for_at_the_open_clock_but_is_at_the_next():
    c = make_controller("sync", 3)
    c.leave(2)                                         # worker 2 died
    c.push(0, 0)
    c.join(2)                                          # its restart says HELLO while clock 0 is open
    assert c.next_clock(2) == 1                        # WELCOME: push clock 1 first, once clock 0's weights exist
    assert not c.pull_ready(2, 1)
    c.push(1, 0)
    assert c.commit_ready()                            # clock 0 did not wait for the rejoiner
    c.committed()
    assert c.pull_ready(2, 1) and c.next_clock(2) == 1
    c.push(0, 1)
    c.push(1, 1)
    assert not c.commit_ready()                        # clock 1 waits for it
    assert c.push(2, 1) is Decision.ACCUMULATE and c.commit_ready()


def test_sync_a_joiner_counts_from_the_clock_it_pulls_when_another_shard_welcomed_it_later():
    c = make_controller("sync", 2)
    c.leave(1)
    c.join(1)                                          # this shard: clock 0 open, so 1 first
    c.expect(1, 2)                                     # another shard had committed clock 0 already: it pulls 2
    c.push(0, 0)
    c.committed()
    c.push(0, 1)
    assert c.commit_ready()                            # clock 1, which it never pushes, is not held for it
    c.committed()
    c.push(0, 2)
    assert not c.commit_ready() and c.next_clock(1) == 2


def test_sync_a_worker_joining_alone_counts_at_once_and_one_left_alone_with_it_moves_on():
    c = make_controller("sync", 2)
    c.finish(0)                                        # worker 0 did its last push and awaits its final pull
    c.leave(1)
    c.join(1)
    assert c.next_clock(1) == 0 and c.pushing() == {1}  # no one else pushes the open clock: it counts now
    d = make_controller("sync", 2)
    d.leave(1)
    d.join(1)                                          # clock 0 open; worker 0 pushes it, the joiner starts at 1
    d.leave(0)                                         # ... but worker 0 dies before pushing it
    assert d.commit_ready()                            # the empty clock ends (no step), so the joiner's pull is answered
    d.committed()
    assert d.pull_ready(1, 1) and d.pushing() == {1}


def test_sync_backup_workers_count_a_joiner_only_from_its_clock():
    c = make_controller("sync", 3, backup_workers=1)
    c.leave(2)
    c.join(2)
    assert c.needed() == 1                             # 2 pushing, 1 backup: the joiner is no straggler yet
    c.push(0, 0)
    assert c.commit_ready()
    c.committed()
    assert c.needed() == 2


def test_sync_a_joiner_survives_a_checkpoint():
    c = make_controller("sync", 2)
    c.leave(1)
    c.join(1)
    d = make_controller("sync", 2)
    d.load_state_dict(c.state_dict())
    assert d.next_clock(1) == 1 and d.pushing() == {0}
