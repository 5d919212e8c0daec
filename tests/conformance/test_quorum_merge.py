"""A quorum's merge weighs each push by the inner steps it covers (`inner_steps`, which a push of local steps
carries), and its grace window closes at the first request after it is over (psrv/server/pushes/grace.py): the
shard driven by hand (tests/unit/test_push_whole.Driven, its clock too), against the weighted mean by hand."""
from __future__ import annotations

import pytest
import torch

from psrv.codecs import make
from psrv.codecs.push import PushEncoder
from psrv.config import OptimConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import ErrorCode, MsgType, ProtocolError
from psrv.server.fragments import FragmentShards
from psrv.server.shard import Shard
from tests.unit.test_push_whole import SIZE, Driven, grads

SGD = OptimConfig(name="sgd", lr=1.0, momentum=0.0)


def test_a_merge_is_the_mean_weighted_by_each_pushs_inner_steps():
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=2)
    w0, (g0, g1, g2) = d.weights, grads(3)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0, fields={"inner_steps": 1})
    d.send(0, MsgType.PUSH, clock=1, tensor=g1, fields={"inner_steps": 2})  # the same worker again: it counts
    assert d.counts()[1] == 0  # one worker of the two: no merge yet
    d.send(1, MsgType.PUSH, clock=0, tensor=g2, fields={"inner_steps": 5})
    assert d.counts()[1] == 1
    want = w0 - (g0 + 2 * g1 + 5 * g2) / 8
    assert torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()


def test_a_compressed_push_is_weighed_alike():
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=2)
    w0, (g0, g1) = d.weights, grads(2)
    enc = PushEncoder(make("topk:0.1"), PartitionPlan((ParamSpec("w", (SIZE,)),), 1), error_feedback=False)
    fields, parts = enc.encode(g1, 0)
    sent = torch.zeros(SIZE)
    top = g1.abs().topk(SIZE // 10).indices
    sent[top] = g1[top]
    d.send(0, MsgType.PUSH, clock=0, tensor=g0, fields={"inner_steps": 3})
    d.send(1, MsgType.PUSH, clock=0, fields={"inner_steps": 2, **fields}, parts=parts)
    want = w0 - (3 * g0 + 2 * sent) / 5
    assert torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3"])
def test_a_bad_inner_steps_is_refused_and_changes_nothing(bad):
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=1)
    w0 = d.weights
    d.send(0, MsgType.PUSH, clock=0, tensor=grads(1)[0], fields={"inner_steps": bad})
    reply = d.net.out[-1]
    assert reply.type is MsgType.ERROR and "inner_steps" in str(reply.fields), reply.fields
    assert torch.equal(d.weights, w0) and d.counts()[:2] == (0, 0)


def test_without_a_quorum_the_barrier_ignores_it():
    """sync's barrier is the plain mean over its clock's pushes, as before inner_steps existed."""
    d = Driven(mode="sync", workers=2, optim=SGD)
    w0, (g0, g1) = d.weights, grads(2)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0, fields={"inner_steps": 1})
    d.send(1, MsgType.PUSH, clock=0, tensor=g1, fields={"inner_steps": 7})
    assert torch.allclose(d.weights, w0 - (g0 + g1) / 2, atol=1e-6)


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


def test_each_fragment_merges_on_its_own_quorum_and_a_late_push_waits_for_its_fragments_next_merge():
    """Decoupled DiLoCo's setting: the quorum is per fragment. Q = 2 of 2: worker 0's pushes of fragments a and b
    wait for worker 1's of each; fragment a steps once, on the mean of a's pushes, while b's merge stays open; a
    whole push cannot join fragments."""
    half = SIZE // 2
    a, b = [[0, half]], [[half, SIZE]]
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=2)
    w0, (g0, g1, g2, g3) = d.weights, grads(4)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0[:half], fields={"fragment": a})
    d.send(0, MsgType.PUSH, clock=1, tensor=g1[half:], fields={"fragment": b})  # its next fragment: b's merge
    assert d.counts()[1] == 0  # one worker of the two in each
    d.send(1, MsgType.PUSH, clock=0, tensor=g2[:half], fields={"fragment": a})
    pushes, updates, _, version = d.counts()
    assert (pushes, updates, version) == (3, 1, 1), d.counts()  # a's merge closed; b's has one worker of two
    want = w0.clone()
    want[:half] -= (g0[:half] + g2[:half]) / 2
    assert torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()
    d.send(0, MsgType.PUSH, clock=2, tensor=g3[:half], fields={"fragment": a})  # a's next merge, beside b's
    assert d.counts()[1] == 1
    d.send(1, MsgType.PUSH, clock=1, tensor=g2[half:], fields={"fragment": b})
    assert d.counts()[1] == 2  # b's merge closed on its two pushes; a's second still waits for worker 1
    want[half:] -= (g1[half:] + g2[half:]) / 2
    assert torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()
    d.send(0, MsgType.PUSH, clock=3, tensor=g1)  # a whole push beside a fragment's open merge
    reply = d.net.out[-1]
    assert reply.type is MsgType.ERROR and "fragment" in str(reply.fields), reply.fields
    assert d.counts()[1] == 2  # nothing of it applied
    d.send(1, MsgType.PUSH, clock=2, tensor=g0[:half], fields={"fragment": a})
    want[:half] -= (g3[:half] + g0[:half]) / 2
    assert d.counts()[1] == 3 and torch.allclose(d.weights, want, atol=1e-6), d.counts()


def test_a_fragments_merge_weighs_its_pushes_by_their_inner_steps():
    half = SIZE // 2
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=2)
    w0, (g0, g1) = d.weights, grads(2)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0[:half], fields={"fragment": [[0, half]], "inner_steps": 3})
    d.send(1, MsgType.PUSH, clock=0, tensor=g1[:half], fields={"fragment": [[0, half]], "inner_steps": 1})
    want = w0.clone()
    want[:half] -= (3 * g0[:half] + g1[:half]) / 4
    assert d.counts()[1] == 1 and torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()


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


def test_an_empty_fragment_merges_apart_from_every_fragment_with_a_piece():
    """A fragment with no piece in this shard (an empty push, part -1) has a merge of its own, even beside a
    fragment whose first element is 1: Q = 2 of 2, one push of each, no merge closes."""
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=2)
    w0, (g0,) = d.weights, grads(1)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0[1:SIZE // 2], fields={"fragment": [[1, SIZE // 2]]})
    d.send(1, MsgType.PUSH, clock=0, tensor=g0[:0], fields={"fragment": []})
    assert d.net.out[-1].type is not MsgType.ERROR, d.net.out[-1].fields
    assert d.counts()[1] == 0 and torch.equal(d.weights, w0), d.counts()


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


def test_a_sync_clock_still_refuses_a_second_fragment():
    half = SIZE // 2
    d = Driven(mode="sync", workers=2, optim=SGD)
    w0, (g0, g1) = d.weights, grads(2)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0[:half], fields={"fragment": [[0, half]]})
    d.send(1, MsgType.PUSH, clock=0, tensor=g1[half:], fields={"fragment": [[half, SIZE]]})
    reply = d.net.out[-1]
    assert reply.type is MsgType.ERROR and ("this sync clock accumulates another fragment (or the whole shard): every "
                                            "worker must sync the same fragment at the same clock") \
        in str(reply.fields), reply.fields  # the refusal's line, as a user reads it
    assert torch.equal(d.weights, w0) and d.counts()[1] == 0


# --- the adaptive grace window (--quorum-grace-adaptive) -----------------------------------------------------
# 3 workers, Q = 2, a window of at most 10 s: workers 0 and 1 push every second (0.1 s apart), worker 2 every 2 s
# from 0.5 s, and not after 4.5 s (dead). (time, worker, updates after it), derived by hand from the rule in
# psrv/server/pushes/grace.py's docstring:
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


def test_a_shard_built_from_its_config_drops_a_push_older_than_quorum_max_age():
    """--quorum-max-age reaches the shard's controller from its config (consistency/__init__.py controller_for):
    quorum 1, max age 1: worker 1's push on weights two merges old is dropped as late, one merge old is not."""
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=1, quorum_max_age=1)
    g = grads(4)
    d.send(0, MsgType.PUSH, clock=0, tensor=g[0], base_version=0)  # merge 1
    d.send(0, MsgType.PUSH, clock=1, tensor=g[1], base_version=1)  # merge 2
    d.send(1, MsgType.PUSH, clock=0, tensor=g[2], base_version=1)  # one merge old: merged (3)
    d.send(2, MsgType.PUSH, clock=0, tensor=g[3], base_version=1)  # two merges old: dropped
    pushes, updates, dropped, _ = d.counts()
    assert (pushes, updates, dropped) == (4, 3, {"late": 1}), d.counts()


def _shard() -> Shard:
    shard = Shard(10, OptimConfig(name="sgd", lr=0.5, momentum=0.9, nesterov=True))
    shard.init(torch.arange(10.0))
    return shard


def test_a_quorum_merges_open_fragments_survive_a_state_dict_and_an_older_one_loads():
    """The fragments a shard's open merges accumulate are in its state (a checkpoint, a joining backup), and a
    state saved before merges took fragments (one open fragment, `open`) still loads."""
    shard, frags = _shard(), FragmentShards()
    frags.accumulate(shard, ((2, 4),), torch.ones(2), merge=True, weight=1)
    frags.accumulate(shard, ((0, 2),), torch.ones(2), merge=True, weight=3)  # a push of 3 inner steps
    frags.accumulate(shard, ((2, 4),), 3 * torch.ones(2), merge=True, weight=1)
    frags.accumulate(shard, ((0, 2),), 3 * torch.ones(2), merge=True, weight=1)
    with pytest.raises(ProtocolError) as err:
        frags.check_whole()
    assert err.value.code is ErrorCode.NOT_ALLOWED
    again = FragmentShards()
    again.load_state_dict(frags.state_dict(), shard)
    assert again.open == [((2, 4),), ((0, 2),)] and again.accumulated == 4
    assert again.apply_accumulated(shard) == [2, 2] and shard.version == 2  # in the order they came in
    # each fragment's mean weighs its pushes by their steps: (2, 4)'s (1 + 3) / 2 = 2, (0, 2)'s (3 + 3) / 4 = 1.5;
    # Nesterov's first step is 0.5 (g + 0.9 g)
    assert shard.weights[:4].tolist() == pytest.approx([-1.425, 1 - 1.425, 2 - 1.9, 3 - 1.9])
    legacy = {**frags.state_dict(), "open": [[2, 4]]}  # saved before a merge took fragments: one open fragment
    del legacy["opened"]
    again.load_state_dict(legacy, shard)
    assert again.open == [((2, 4),)]
    again.load_state_dict({**legacy, "open": None}, shard)
    assert again.open == []


@pytest.mark.parametrize("optim", [OptimConfig(name="sgd", lr=1.0, momentum=0.0, update_rule="dc-asgd"),
                                   OptimConfig(name="sgd", lr=1.0, momentum=0.0, clip_grad_norm=1.0)],
                         ids=["dc-asgd", "clip"])
def test_a_shard_that_needs_whole_pushes_refuses_a_fragment(optim):
    """The config tree refuses fragments with dc-asgd or a clip; a client that pushes one anyway is refused by the
    shard, NOT_ALLOWED, with nothing applied."""
    d = Driven(mode="async", workers=1, optim=optim)
    w0, (g,) = d.weights, grads(1)
    d.send(0, MsgType.PUSH, clock=0, tensor=g[:4], fields={"fragment": [[0, 4]]})
    reply = d.net.out[-1]
    assert reply.type is MsgType.ERROR and reply.fields.get("code") == ErrorCode.NOT_ALLOWED.value, reply.fields
    assert ("this shard clips by the global norm or corrects by each worker's pulled weights (dc-asgd): it takes "
            "whole pushes, not fragments") in str(reply.fields), reply.fields
    assert torch.equal(d.weights, w0) and d.counts()[1] == 0


def test_a_fragment_of_three_ranges_steps_each_of_its_pieces():
    """A fragment's pieces in a shard (one per tensor of it there), gathered and scattered in order: three here."""
    d = Driven(mode="async", workers=1, optim=SGD)
    w0, (g,) = d.weights, grads(1)
    pieces = [[0, 3], [5, 9], [12, 14]]
    sent = torch.cat([g[a:b] for a, b in pieces])
    d.send(0, MsgType.PUSH, clock=0, tensor=sent, fields={"fragment": pieces})
    want = w0.clone()
    for a, b in pieces:
        want[a:b] -= g[a:b]
    assert d.counts()[1] == 1 and torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()
