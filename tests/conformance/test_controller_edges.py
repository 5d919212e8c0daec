"""What no case of the matrix shows about the consistency controllers, found by `make mutants`
(tests/conformance/mutants.py): SSP with its bound at zero is accepted and is BSP's barrier (the matrix's ssp
cases use bounds of 1 and more), and a negative bound is refused in one line naming it; BSP's barrier with a
worker that rejoins while the others push (it counts from the next clock), a restored shard's jump to the clock
the workers are at, and its state through a checkpoint, whole (the matrix restarts no sync shard mid-clock)."""
import pytest

from psrv.server.consistency import AsyncController, Decision, make_controller
from psrv.server.consistency.ssp import SSPController
from psrv.server.consistency.sync import SyncController


def bsp_pull_ready(clocks: dict[int, int], clock: int) -> bool:
    """BSP, from its definition: a pull for `clock` waits until every worker has pushed every clock before it."""
    return all(pushed >= clock for pushed in clocks.values())


def test_ssp_at_staleness_0_is_accepted_and_is_the_bsp_barrier():
    c = SSPController(3, staleness=0)
    pushes = [(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (2, 1), (0, 2)]
    clocks = {w: 0 for w in range(3)}
    for worker, clock in pushes:
        c.push(worker, clock)
        clocks[worker] = clock + 1
        for w in range(3):  # each worker's pull for the clock it pushes next
            assert c.pull_ready(w, clocks[w]) == bsp_pull_ready(clocks, clocks[w]), (worker, clock, w, clocks)
    assert make_controller("ssp", 2, staleness=0).staleness == 0


def test_a_negative_staleness_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^staleness must be >= 0; got -1$"):
        SSPController(2, staleness=-1)


def observed(c: SyncController) -> dict:
    """Everything a sync controller's answers depend on, as plain values."""
    return {"open_clock": c.open_clock, "arrived": set(c.arrived), "voided": set(c.voided), "skipped": c.skipped,
            "joining": dict(c.joining), "active": set(c.active), "clocks": dict(c.clocks), "min": c.min_clock(),
            "pushing": c.pushing(), "needed": c.needed(), "ready": c.commit_ready()}


def test_a_worker_rejoining_while_others_push_counts_from_the_next_clock_and_never_holds_the_open_one():
    """BSP with a rejoin, from its definition: the open clock's barrier waits for the workers that were pushing
    it when it opened; a worker that rejoins meanwhile pulls the open clock's commit and is waited for from the
    clock after it, and from then on as any other. Alone, a joiner is waited for at once."""
    c = SyncController(3)
    c.push(0, 0)
    c.leave(2)
    c.join(2)  # 0 and 1 still push clock 0
    assert c.counted_from(2) == 1 and c.next_clock(2) == 1 and c.pushing() == {0, 1}
    c.push(1, 0)
    assert c.commit_ready()  # without 2: it counts from clock 1
    c.committed()
    assert c.open_clock == 1 and c.counted_from(2) is None and c.pushing() == {0, 1, 2} and c.needed() == 3
    c.push(0, 1)
    c.push(1, 1)
    assert not c.commit_ready()  # clock 1 waits for the joiner now
    c.push(2, 1)
    assert c.commit_ready()

    c.leave(0)
    c.join(0)  # a joiner again, then gone before it counted: no clock waits for it
    assert c.counted_from(0) == 2
    c.leave(0)
    assert c.counted_from(0) is None and c.pushing() == {1, 2}

    alone = SyncController(2)
    alone.leave(0)
    alone.leave(1)
    alone.join(1)  # no one else pushes: it counts at once
    assert alone.counted_from(1) is None and alone.pushing() == {1} and alone.next_clock(1) == 0


def test_a_joiner_that_pulls_a_later_clock_is_counted_from_that_one():
    c = SyncController(3)
    c.push(0, 0)
    c.leave(2)
    c.join(2)
    c.expect(2, 3)  # another shard welcomed it later: this one must not wait for clocks 1 and 2 of it
    assert c.counted_from(2) == 3
    c.expect(2, 2)  # an earlier clock changes nothing
    assert c.counted_from(2) == 3
    for clock in (0, 1):
        c.push(0, clock)
        c.push(1, clock)
        assert c.commit_ready() and 2 not in c.pushing(), clock
        c.committed()
    c.push(0, 2)
    c.push(1, 2)
    c.committed()
    assert c.open_clock == 3 and c.pushing() == {0, 1, 2}


def test_a_restored_shard_jumps_to_the_clock_the_workers_push_and_counts_the_clocks_it_lost():
    """A shard restored from a checkpoint of clock 3 gets a push for clock 7 (the others committed 3 to 6): its
    open clock jumps to 7, the sum it held is void, 4 clocks are counted lost, a joiner due by then counts now;
    the same push on a shard never restored, or a clock not ahead of it, changes nothing."""
    c = SyncController(3)
    for clock in range(3):
        for w in range(3):
            c.push(w, clock)
        c.committed()
    c.push(0, 3)
    c.joining = {1: 5, 2: 9}
    restored = SyncController(3)
    restored.load_state_dict(c.state_dict())
    assert restored.catch_up(3) == 0 and restored.open_clock == 3 and restored.arrived == {0}
    assert restored.catch_up(7) == 4
    assert (restored.open_clock, restored.arrived, restored.voided, restored.skipped) == (7, set(), set(), 4)
    assert restored.joining == {2: 9}
    assert restored.catch_up(9) == 2 and restored.skipped == 6 and restored.joining == {}
    before = observed(c)
    assert c.catch_up(7) == 0 and observed(c) == before  # never restored: no clock it did not open is skipped


def test_a_sync_controllers_state_survives_a_checkpoint_whole():
    """Mid-clock, with a voided push, a joiner, clocks lost to an earlier restore and a worker gone: a controller
    loaded from its state_dict answers as the one saved, and is marked restored."""
    c = SyncController(4, backup_workers=1)
    for w in range(4):
        c.push(w, 0)
    c.committed()
    c.push(0, 1)
    c.push(1, 1)
    c.void(1)
    c.leave(3)
    c.join(3)
    c.skipped = 2
    state = c.state_dict()
    loaded = SyncController(4, backup_workers=1)
    loaded.load_state_dict(state)
    assert observed(loaded) == observed(c)
    assert observed(loaded) == {"open_clock": 1, "arrived": {0, 1}, "voided": {1}, "skipped": 2, "joining": {3: 2},
                                "active": {0, 1, 2, 3}, "clocks": {0: 2, 1: 2, 2: 1, 3: 1}, "min": 1,
                                "pushing": {0, 1, 2}, "needed": 2, "ready": False}
    assert loaded.resumed and not c.resumed
    with pytest.raises(ValueError, match="checkpoint holds a 'sync' controller, this server runs 'ssp'"):
        SSPController(4, staleness=1).load_state_dict(state)


def test_sync_backup_workers_are_fewer_than_the_workers_or_refused_naming_the_range():
    assert SyncController(3, backup_workers=2).needed() == 1
    for backups in (3, -1):
        with pytest.raises(ValueError, match=rf"^backup_workers must be in \[0, 3\); got {backups}$"):
            SyncController(3, backup_workers=backups)


def test_a_clock_no_one_is_left_to_push_ends_empty_so_a_joiner_waiting_past_it_is_not_held():
    """Worker 1 rejoins while worker 0 is to push clock 0, so it counts from clock 1; then worker 0 leaves
    without pushing. No gradient will come for clock 0, and the joiner waits for clock 1: clock 0 must end
    (empty). Before worker 0 left, clock 0 waited for it."""
    c = SyncController(2)
    c.leave(1)
    c.join(1)
    assert c.counted_from(1) == 1 and c.commit_ready() is False
    c.leave(0)
    assert c.pushing() == set() and c.commit_ready() is True
    c.committed()
    assert c.open_clock == 1 and c.pushing() == {1}
    assert SyncController(2).commit_ready() is False  # no one has pushed, no one joins: nothing ends


def test_a_joiner_that_says_hello_again_once_alone_is_counted_at_once():
    """Worker 1 rejoins while worker 0 pushes (it counts from clock 1); worker 0 leaves; worker 1's HELLO comes
    again. Alone now, it is waited for at once, as a first join alone is: its earlier joining clock is gone."""
    c = SyncController(2)
    c.leave(1)
    c.join(1)
    c.leave(0)
    assert c.counted_from(1) == 1
    c.join(1)
    assert c.counted_from(1) is None and c.pushing() == {1} and c.next_clock(1) == 0


def test_a_state_saved_before_voided_skipped_and_joining_were_kept_loads_with_none():
    """A sync controller's state from before it kept voided pushes, lost clocks and joiners (their keys
    absent) loads as one with none of them."""
    c = SyncController(2)
    c.load_state_dict({"mode": "sync", "active": [0, 1], "clocks": {"0": 3, "1": 2}, "open_clock": 2,
                       "arrived": [0]})
    assert observed(c) == {"open_clock": 2, "arrived": {0}, "voided": set(), "skipped": 0, "joining": {},
                           "active": {0, 1}, "clocks": {0: 3, 1: 2}, "min": 2, "pushing": {0, 1}, "needed": 2,
                           "ready": False}


@pytest.mark.parametrize("mode", ["sync", "async", "ssp", "quorum"])
def test_the_slowest_active_clock_is_kept_through_pushes_leaves_and_joins(mode):
    """The controllers keep the slowest active worker's clock incrementally (a leave or join counts one clock, not
    every worker's): after every step of a random run of pushes, leaves and rejoins it is the minimum over the
    active workers' clocks, written out here, and clock_gap and SSP's pulls follow it (a pull at or behind the
    slowest clock has a gap of 0: the summary's max_clock_gap is 0 under sync)."""
    import random
    draw = random.Random(7)
    c = make_controller("sync" if mode == "quorum" else mode, 5, staleness=2, quorum=2 if mode == "quorum" else 0)
    clocks = {w: 0 for w in range(5)}
    active = set(range(5))
    for _ in range(400):
        w, what = draw.randrange(5), draw.random()
        if what < 0.15:
            c.leave(w)
            active.discard(w)
        elif what < 0.3:
            c.join(w)
            active.add(w)
        else:
            clock = clocks[w] + draw.randrange(0, 3) if mode != "sync" else c.next_clock(w)
            c.push(w, clock)
            clocks[w] = max(clocks[w], clock + 1)
            if c.commit_ready():
                c.committed()
        want = min((clocks[x] for x in active), default=0)
        assert c.min_clock() == want, (mode, w, what, clocks, active)
        assert c.clock_gap(want + 3) == (3 if active else 0)
        assert c.clock_gap(want) == c.clock_gap(max(0, want - 1)) == 0  # the slowest, or behind it: no gap


@pytest.mark.parametrize("mode", ["sync", "quorum"])
def test_the_counted_barrier_is_the_scanned_one_through_joins_leaves_finishes_and_loads(mode):
    """A barrier's test per push counts its workers (pushing_count, and commit_ready's early answer) instead of
    scanning them: after every step of a random run of pushes (some of them void), leaves, joins, finishes and loads, the
    count is len(pushing()) and commit_ready is the test written out from the sets."""
    import random
    draw = random.Random(11)
    c = make_controller("sync", 6, quorum=3 if mode == "quorum" else 0, backup_workers=1 if mode == "sync" else 0)
    for _ in range(600):
        w, what = draw.randrange(6), draw.random()
        if what < 0.1:
            c.leave(w)
        elif what < 0.2:
            c.join(w)
        elif what < 0.27:
            c.finish(w)
        elif what < 0.3:
            c.load_state_dict(c.state_dict())
        elif c.push(w, c.next_clock(w)) is not Decision.DROP and what < 0.4:
            c.void(w)  # a non-finite push: no gradient
        pushing = c.pushing()
        assert c.pushing_count() == len(pushing), (mode, w, what)
        if mode == "sync":
            have = (c.arrived - c.voided) & pushing
            want = (bool(c.joining) and not pushing) if not c.arrived else \
                len(have) >= max(1, len(pushing) - c.backup_workers) or pushing <= c.arrived
        else:
            met = len(c.gradients.keys() & pushing) >= max(1, min(c.quorum, len(pushing)))
            want = bool(c.gradients) and (pushing <= c.arrived or met)
        assert c.commit_ready() == want, (mode, w, what)
        if want:
            c.committed()


@pytest.mark.parametrize("mode", ["async", "ssp", "sync"])
def test_a_finished_worker_that_joins_again_pushes_again(mode):
    """A worker whose final pull came (finish) and that says HELLO again (a relaunch) is no longer finished: it
    pushes again (under sync, from the clock after the open one, as any joiner), and the slowest clock is its own."""
    c = make_controller(mode, 3, staleness=1)
    for w in range(3):
        c.push(w, 0)
    c.finish(1)
    assert c.pushing() == {0, 2} and c.pushing_count() == 2
    c.leave(1)
    c.join(1)
    c.finish(2)
    c.join(2)  # a HELLO again without a leave
    assert not c.finishing and c.min_clock() == 1
    if mode == "sync":  # joiners, counted from the clock after the open one
        assert (c.counted_from(1), c.counted_from(2)) == (c.open_clock + 1, c.open_clock + 1)
    else:
        assert c.pushing() == {0, 1, 2} and c.pushing_count() == 3


def test_make_controllers_defaults_are_the_plain_modes():
    """make_controller is psrv.server.consistency's public constructor: a setting left out is the plain mode's,
    as the CLI's defaults are (no backup workers, SSP's bound 0, a quorum with no age limit and no window). Its
    bound behaviour follows: BSP waits for all three workers."""
    sync = make_controller("sync", 3)
    assert isinstance(sync, SyncController) and sync.backup_workers == 0
    for w in (0, 1):
        sync.push(w, 0)
    assert not sync.commit_ready()  # a backup worker would let two of three close the clock
    assert make_controller("ssp", 3).staleness == 0
    quorum = make_controller("sync", 3, quorum=2)
    assert (quorum.quorum, quorum.max_age, quorum.grace) == (2, 0, False)
    assert isinstance(make_controller("async", 3), AsyncController)
    with pytest.raises(ValueError, match=r"^mode must be one of sync, async, ssp; got 'bsp'$"):
        make_controller("bsp", 3)


@pytest.mark.parametrize("mode", ["sync", "async", "ssp"])
def test_a_state_with_no_active_worker_loads_with_the_slowest_clock_0(mode):
    """A shard's last checkpoint may be written after every worker left: loaded (--resume), its active set is empty,
    and the slowest active clock is 0, as a controller's whose workers all left, not an error or another clock."""
    c = make_controller(mode, 2, staleness=1)
    c.load_state_dict({"mode": mode, "active": [], "clocks": {0: 4, 1: 6}, **({"open_clock": 6, "arrived": [],
                       "voided": [], "skipped": 0, "joining": {}} if mode == "sync" else {})})
    assert c.active == set() and c.min_clock() == 0 and c.clock_gap(6) == 0
    c.join(0)
    assert c.min_clock() == 4
