"""A quorum's grace window (`--quorum-grace`, psrv/server/pushes/grace.py): it closes its merge at the first request
after it is over; each fragment's merge has a window of its own; the adaptive window (`--quorum-grace-adaptive`) waits
only for a worker expected before the merge's own workers push again. The shard driven by hand on a clock by hand
(tests/unit/test_push_whole.Driven), against the merges and weights derived by hand from the rule."""
from __future__ import annotations

import torch

from psrv.protocol import MsgType
from psrv.config import OptimConfig
from tests.unit.test_push_whole import SIZE, Driven, grads

SGD = OptimConfig(name="sgd", lr=1.0, momentum=0.0)


def test_a_grace_window_closes_its_merge_at_the_first_request_after_it_and_before_that_request():
    clock = [100.0]
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=1, quorum_grace=0.5, now=lambda: clock[0])
    w0, (g0, g1, g2) = d.weights, grads(3)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0)  # the quorum of 1 is in: the window opens at 100.0
    clock[0] = 100.4
    d.send(1, MsgType.PUSH, clock=0, tensor=g1)  # within the window: it joins the merge
    assert d.counts()[1] == 0
    clock[0] = 100.6
    d.send(2, MsgType.PUSH, clock=0, tensor=g2)  # the window is over: the merge closes first, this push opens the next
    assert d.counts()[1] == 1
    assert torch.allclose(d.weights, w0 - (g0 + g1) / 2, atol=1e-6)
    d.send(0, MsgType.PULL, clock=1)  # a pull at 100.6: the next merge's window (opened at 100.6) is not over
    assert d.counts()[1] == 1
    clock[0] = 101.2
    d.send(1, MsgType.PULL, clock=1)  # any request after it closes it
    assert d.counts()[1] == 2
    assert torch.allclose(d.weights, w0 - (g0 + g1) / 2 - g2, atol=1e-6)


def test_each_fragments_merge_has_a_grace_window_of_its_own():
    """Q = 1 of 2, a window of 1 s, the clock by hand: fragment a's merge opens at 0.0, b's at 0.5. At 1.2 a's
    window is over (it closes alone, before the request is handled) and b's is not: worker 1's push of b joins
    b's merge, which then has both workers. One window for both merges would have closed b's without it."""
    half, clock = SIZE // 2, [0.0]
    a, b = [[0, half]], [[half, SIZE]]
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=1, quorum_grace=1.0, now=lambda: clock[0])
    w0, (g0, g1, g2) = d.weights, grads(3)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0[:half], fields={"fragment": a})
    clock[0] = 0.5
    d.send(0, MsgType.PUSH, clock=1, tensor=g1[half:], fields={"fragment": b})
    assert d.counts()[1] == 0  # both met, both windows open
    clock[0] = 1.2
    d.send(1, MsgType.PUSH, clock=0, tensor=g2[half:], fields={"fragment": b})
    assert d.counts()[1] == 2
    want = w0.clone()
    want[:half] -= g0[:half]
    want[half:] -= (g1[half:] + g2[half:]) / 2
    assert torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()


def test_a_fragments_next_merge_starts_a_window_of_its_own():
    """Q = 1 of 2, a window of 1 s, fragment a alone: merge 1 of a opens at 0.0 (its window until 1.0) and closes
    at 0.2 with both workers in; merge 2 opens at 0.5, so its window runs until 1.5, and worker 1's push at 1.2
    joins it. A window left over from merge 1 (over at 1.0) would close merge 2 at 1.2 without worker 1."""
    half, clock = SIZE // 2, [0.0]
    a = [[0, half]]
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=1, quorum_grace=1.0, now=lambda: clock[0])
    w0, g = d.weights, grads(4)
    for t, worker, i in [(0.0, 0, 0), (0.2, 1, 1), (0.5, 0, 2), (1.2, 1, 3)]:
        clock[0] = t
        d.send(worker, MsgType.PUSH, clock=i // 2, tensor=g[i][:half], fields={"fragment": a})
    assert d.counts()[1] == 2
    want = w0.clone()
    want[:half] -= (g[0][:half] + g[1][:half]) / 2 + (g[2][:half] + g[3][:half]) / 2
    assert torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()


def test_an_adaptive_window_is_judged_on_the_pushed_fragments_merge():
    """3 workers, Q = 2, an adaptive window of at most 10 s, fragments a and b in turn; worker 2 pushes a once (at
    0.2) and no more. At 1.1 worker 1's push of b completes b's quorum: b's window is planned then, on b's merge,
    to end at 2.0, when worker 0 is due again (worker 2, one push and no interval yet, may come by then). Worker
    0's push at 2.0 finds it over: b closes before it. Planned on another merge, the window would be the 10 s."""
    half, clock = SIZE // 2, [0.0]
    a, b = [[0, half]], [[half, SIZE]]
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=2, quorum_grace=10.0, quorum_grace_adaptive=True,
               now=lambda: clock[0])
    events = [(0.0, 0, a), (0.1, 1, a), (0.2, 2, a), (1.0, 0, b), (1.1, 1, b), (2.0, 0, a)]
    g, counts = grads(len(events)), []
    for i, (t, worker, ranges) in enumerate(events):
        clock[0] = t
        lo, hi = ranges[0]
        d.send(worker, MsgType.PUSH, clock=i, tensor=g[i][lo:hi], fields={"fragment": ranges})
        assert d.net.out[-1].type is not MsgType.ERROR, d.net.out[-1].fields
        counts.append(d.counts()[1])
    assert counts == [0, 0, 1, 1, 1, 2]
    for malformed in ([5], [[]], [["x", 3]]):  # judged before it is handled, refused when it is
        d.send(1, MsgType.PUSH, clock=9, tensor=g[0][:3], fields={"fragment": malformed})
        assert d.net.out[-1].type is MsgType.ERROR and d.counts()[1] == 2, d.net.out[-1].fields


def test_an_adaptive_window_planned_as_another_fragments_window_ends_is_kept():
    """3 workers, Q = 2, an adaptive window of at most 5 s, fragments a and b. a's merge has its Q at 0.1 (worker 2
    never seen: the window runs to the ceiling, 5.1). At 5.2 worker 1's push completes b's quorum as a's window
    ends: b's window is planned to end at worker 0's expected re-push, 6.0 (its last at 3.0, its interval 3.0),
    and a's merge closes first. b's merge must keep that plan: a request at 7.0 closes it. Before, the look at b's
    merge while a's closed (the push not yet in it) dropped the plan, and b's window ran to the ceiling, 10.2."""
    half, clock = SIZE // 2, [0.0]
    a, b = [[0, half]], [[half, SIZE]]
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=2, quorum_grace=5.0, quorum_grace_adaptive=True,
               now=lambda: clock[0])
    g, merges = grads(5), []
    for i, (t, worker, fragment) in enumerate([(0.0, 0, a), (0.1, 1, a), (3.0, 0, b), (5.2, 1, b), (7.0, 2, a)]):
        clock[0] = t
        d.send(worker, MsgType.PUSH, clock=i, tensor=g[i][:half] if fragment is a else g[i][half:],
               fields={"fragment": fragment})
        assert d.net.out[-1].type is not MsgType.ERROR, d.net.out[-1].fields
        merges.append(d.counts()[1])
    assert merges == [0, 0, 0, 1, 2]  # a's merge at 5.2, b's at 7.0 (before worker 2's push, which opens a's next)


ADAPTIVE = [
    (0.0, 0, 0), (0.1, 1, 0),  # Q in; worker 2 has no interval yet: wait (up to 10 s; no re-push expected yet)
    (0.5, 2, 1),               # every worker in: merge 1
    (1.0, 0, 1), (1.1, 1, 1),  # Q in; worker 2 still has no interval: wait until worker 0's re-push, due at 2.0
    (2.0, 0, 2),               # the window is over: merge 2 {0, 1} closes before this push, which opens merge 3
    (2.1, 1, 2), (2.5, 2, 3),  # Q in, wait until 3.0; worker 2 comes: merge 3 holds all three
    (3.0, 0, 3), (3.1, 1, 4),  # worker 2 is expected at 4.5, after worker 0's re-push at 4.0: no window, merge 4 now
    (4.0, 0, 4), (4.1, 1, 4),  # worker 2 expected at 4.5, before 5.0: wait
    (4.5, 2, 5),               # it comes: merge 5 holds all three
    (5.0, 0, 5), (5.1, 1, 6),  # worker 2 expected at 6.5, after 6.0: merge 6 now
    (6.0, 0, 6), (6.1, 1, 6),  # 6.5 is before 7.0: wait (worker 2 is dead, but not yet late)
    (7.0, 0, 7), (7.1, 1, 7),  # merge 7 closes at 7.0; worker 2 late by less than its interval (8.5): wait
    (8.0, 0, 8), (8.1, 1, 8),  # merge 8 at 8.0; 8.5 is still after 8.1: wait
    (9.0, 0, 9), (9.1, 1, 10),  # merge 9 at 9.0; worker 2 late by more than an interval: not waited for
]


MERGES = [(0, 1, 2), (3, 4), (5, 6, 7), (8, 9), (10, 11, 12), (13, 14), (15, 16), (17, 18), (19, 20), (21, 22)]


def test_an_adaptive_window_waits_only_for_a_worker_expected_before_the_merges_own_push_again():
    clock = [0.0]
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=2, quorum_grace=10.0, quorum_grace_adaptive=True,
               now=lambda: clock[0])
    w0, g = d.weights, grads(len(ADAPTIVE))
    for i, (t, worker, updates) in enumerate(ADAPTIVE):
        clock[0] = t
        kind = MsgType.PUSH_PULL if worker == 1 else MsgType.PUSH  # the window reads both kinds of push
        d.send(worker, kind, clock=i, tensor=g[i])
        assert d.net.out[-1].type is not MsgType.ERROR, d.net.out[-1].fields
        assert d.counts()[1] == updates, f"at {t} s (worker {worker}): {d.counts()[1]} merges, expected {updates}"
    want = w0 - sum(sum(g[i] for i in m) / len(m) for m in MERGES)
    assert torch.allclose(d.weights, want, atol=1e-5), (d.weights - want).abs().max()


def test_a_fixed_window_waits_its_seconds_where_the_adaptive_one_would_not():
    """The same pushes under a fixed window of 10 s: every merge but the first waits for the window or for all
    three (none closes at the Q-th), so fewer merges than the adaptive window's."""
    clock = [0.0]
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=2, quorum_grace=10.0, now=lambda: clock[0])
    for i, (t, worker, _) in enumerate(ADAPTIVE):
        clock[0] = t
        d.send(worker, MsgType.PUSH_PULL, clock=i, tensor=grads(1)[0])
    assert d.counts()[1] == 3  # all three at 0.5, 2.5 and 4.5; the 10 s window is never over by 9.1


def test_the_adaptive_windows_end_at_its_edges():
    """adaptive_end's comparisons at equality, its ceiling, and PushTimes' mean (each new interval weighs half)."""
    from psrv.server.pushes.grace import PushTimes, adaptive_end
    times = PushTimes()
    for w, at in [(0, 0.0), (0, 1.0), (0, 3.0)]:  # intervals 1 then 2: the mean 1.5, the next push due at 4.5
        times.saw(w, at)
    assert times.gap[0] == 1.5
    times.saw(1, 2.0), times.saw(1, 3.5)  # due at 5.0
    assert adaptive_end(3.2, {0}, set(), times, 10.0) == 3.2  # no one outside: no window
    assert adaptive_end(3.2, {0}, {1}, times, 10.0) == 3.2  # 1 is due at 5.0, after 0's re-push at 4.5
    assert adaptive_end(3.2, {1}, {0}, times, 10.0) == 5.0  # 0 is due at 4.5, before 1's re-push at 5.0
    assert adaptive_end(3.0, {1}, {0}, times, 1.0) == 3.0  # the ceiling (4.0) comes before 0 is due: none
    assert adaptive_end(3.0, {1}, {0}, times, 1.5) == 4.5  # due exactly at the window's end: waited for
    times.saw(2, 0.0), times.saw(2, 1.0)  # due at 2.0, late since
    assert adaptive_end(3.0, {1}, {2}, times, 10.0) == 5.0  # late by exactly its interval: still waited for
    assert adaptive_end(3.01, {1}, {2}, times, 10.0) == 3.01  # late by more: not
    assert adaptive_end(3.0, {1}, {3}, times, 10.0) == 5.0  # never seen: it may push at any time
    times.forget(1)
    assert adaptive_end(3.0, {1}, {3}, times, 10.0) == 13.0  # no re-push known inside: the ceiling
    times.saw(1, 10.0)
    assert 1 not in times.gap  # forgotten whole: its next push is its first
    times.forget(9)  # a worker that left before it ever pushed: nothing to forget, and no error
    times.saw(4, 0.5)
    times.forget(4)  # one that left after one push: a last push, no interval yet
    assert 4 not in times.last and 4 not in times.gap


def _scripted(events, *, ceiling: float) -> list[int]:
    """Each event's merge count after it: (time, worker) pushes, or (time, worker, "hello") a worker's HELLO
    again (a restart), on a shard of 3 workers, Q = 2, an adaptive window of at most `ceiling` seconds."""
    clock = [0.0]
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=2, quorum_grace=ceiling, quorum_grace_adaptive=True,
               now=lambda: clock[0])
    hello = {"plan_hash": "p", "total": SIZE, "num_shards": 1, "shard": 0, "world_size": 3}
    g, counts = grads(len(events)), []
    for i, (t, worker, *hello_again) in enumerate(events):
        clock[0] = t
        if hello_again:
            d.send(worker, MsgType.HELLO, fields=hello)
        else:
            d.send(worker, MsgType.PUSH, clock=i, tensor=g[i])
        assert d.net.out[-1].type is not MsgType.ERROR, d.net.out[-1].fields
        counts.append(d.counts()[1])
    return counts


def test_the_window_is_judged_at_the_push_that_completes_the_quorum_not_before():
    """Workers push every second, at .0, .5 and .7; a ceiling of 0.3 s. At 2.0 (worker 0, the merge's first push)
    no one is due within 0.3 s; at 2.5 (worker 1, the quorum) worker 2 is due at 2.7, before 2.8: the window waits
    for it, and merge 3 holds all three. Judged at 2.0 instead, it would close at 2.5 without worker 2."""
    events = [(k + dt, w) for k in range(3) for w, dt in enumerate((0.0, 0.5, 0.7))]
    assert _scripted(events, ceiling=0.3) == [0, 0, 1, 1, 1, 2, 2, 2, 3]


def test_a_worker_that_says_hello_again_is_new_to_the_window():
    """Worker 2 pushes every 4 s, workers 0 and 1 every second: once its interval is known (4.5), it is not
    waited for (5.1: merge 6 at once); restarted (HELLO at 5.2), its pushes are forgotten and it may push at any
    time: at 6.1 the window waits (until 7.0)."""
    events = [(0.0, 0), (0.1, 1), (0.5, 2), (1.0, 0), (1.1, 1), (2.0, 0), (2.1, 1), (3.0, 0), (3.1, 1), (4.0, 0),
              (4.1, 1), (4.5, 2), (5.0, 0), (5.1, 1), (5.2, 2, "hello"), (6.0, 0), (6.1, 1)]
    assert _scripted(events, ceiling=10.0) == [0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 6, 6]


def test_a_loaded_merge_that_has_its_quorum_gets_a_window_from_the_load():
    """A shard's state holds no time, so a shard that loads one (a checkpoint resumed, a primary's state on its
    backup, which may be promoted) starts each loaded merge's window from the load. Q = 1 of 3, 0.5 s: the
    source's merge has worker 0's push (its window opened at 100.0); the loader, whose own window (its merge
    with worker 1's push, 100.1) is replaced, loads at 100.3. At 100.7 its window (to 100.8) is not over; a
    request at 100.9 closes the merge with worker 0's push alone. Without a window from the load, the merge
    stayed open until its next push; with the replaced one kept, it closed at 100.7 (and with worker 1's gradient
    gone)."""
    clock = [100.0]
    kw = dict(mode="sync", workers=3, optim=SGD, quorum=1, quorum_grace=0.5, now=lambda: clock[0])
    source, loader = Driven(**kw), Driven(**kw)
    w0, (g0, g1) = source.weights, grads(2)
    source.send(0, MsgType.PUSH, clock=0, tensor=g0)
    clock[0] = 100.1
    loader.send(1, MsgType.PUSH, clock=0, tensor=g1)
    clock[0] = 100.3
    loader.svc.checkpoints.load_state_dict(source.svc.checkpoints.state_dict())
    clock[0] = 100.7
    loader.send(2, MsgType.PULL, clock=0)
    assert loader.counts()[1] == 0
    clock[0] = 100.9
    loader.send(2, MsgType.PULL, clock=0)
    assert loader.counts()[1] == 1
    assert torch.allclose(loader.weights, w0 - g0, atol=1e-6)
