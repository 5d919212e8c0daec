"""A quorum's merge weighs each push by the inner steps it covers (`inner_steps`, which a push of local steps
carries), each fragment merges on its own quorum, and the open merges travel in the shard's state: the shard driven
by hand (tests/unit/test_push_whole.Driven), against the weighted mean by hand. Its grace window:
test_quorum_grace.py."""
from __future__ import annotations

import pytest
import torch

from psrv.codecs import make
from psrv.codecs.push import PushEncoder
from psrv.config import OptimConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import ErrorCode, MsgType, ProtocolError
from psrv.server.consistency.quorum import QuorumController
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


def test_an_empty_fragment_merges_apart_from_every_fragment_with_a_piece():
    """A fragment with no piece in this shard (an empty push, part -1) has a merge of its own, even beside a
    fragment whose first element is 1: Q = 2 of 2, one push of each, no merge closes."""
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=2)
    w0, (g0,) = d.weights, grads(1)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0[1:SIZE // 2], fields={"fragment": [[1, SIZE // 2]]})
    d.send(1, MsgType.PUSH, clock=0, tensor=g0[:0], fields={"fragment": []})
    assert d.net.out[-1].type is not MsgType.ERROR, d.net.out[-1].fields
    assert d.counts()[1] == 0 and torch.equal(d.weights, w0), d.counts()


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


# 3 workers, Q = 2, a window of at most 10 s: workers 0 and 1 push every second (0.1 s apart), worker 2 every 2 s
# from 0.5 s, and not after 4.5 s (dead). (time, worker, updates after it), derived by hand from the rule in
# psrv/server/pushes/grace.py's docstring:
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
    assert err.value.code is ErrorCode.NOT_ALLOWED  # and the worker is told why, whole (an ERROR reply's message)
    assert err.value.message == "this sync clock accumulates a fragment; a whole push cannot join it"
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


def test_a_parked_fragments_merge_stops_counting_a_worker_that_leaves_and_counts_it_again_when_it_joins():
    """A fragment's open merge, parked while another fragment's is selected, counts only the workers still
    pushing toward its quorum, as the selected merge does: a worker that leaves stops counting there (its push
    stays in the merge), one that joins again counts again, and one whose push carried no gradient (non-finite)
    counts as arrived, not toward the quorum. The controller driven by hand, each decision against the rule read
    from the sets: Q = 3 of the workers still pushing have a gradient in it, or every one of them arrived."""
    a, b = 0, 1
    c = QuorumController(4, quorum=3)
    assert c.parts() == [None]  # before any push: the whole pushes' one part, nothing open

    def ready(part: int) -> bool:
        c.select(part)
        return c.commit_ready()

    c.push(0, 0, part=a)
    c.push(1, 0, part=a)
    c.push(0, 1, part=b)  # b's merge selected: a's parked, workers 0 and 1 in it
    c.leave(0)
    assert not ready(a)  # pushing 1, 2, 3: only 1 of them in a's merge (0's push stays, uncounted)
    c.push(2, 0, part=a)
    assert not ready(a)  # 1 and 2: two of the three
    c.select(b)
    c.join(0)  # 0 pushes again: its push in a's parked merge counts again
    assert ready(a)  # 0, 1, 2 of the pushing 0-3: Q
    c.committed()
    c.push(0, 2, part=a)
    c.push(1, 1, part=a)
    c.push(3, 0, part=a)
    c.void(3)  # arrived without a gradient: 0, 1 toward Q, 0, 1, 3 arrived
    assert not c.commit_ready()
    c.select(b)
    c.leave(0)  # a parked: 1 toward Q, 1 and 3 arrived, of the pushing 1, 2, 3
    c.push(2, 1, part=a)
    assert c.commit_ready()  # every pushing worker (1, 2, 3) arrived, though only 1 and 2 have gradients
