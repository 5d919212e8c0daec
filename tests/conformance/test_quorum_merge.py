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
from psrv.protocol import MsgType
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


def test_a_merge_of_fragment_pushes_steps_each_fragment_on_the_mean_of_its_own():
    """Decoupled DiLoCo's setting: workers at different clocks push different fragments into one merge; each
    fragment steps once, by its own optimizer, on the mean of the pushes that carried it; a whole push cannot
    join them."""
    half = SIZE // 2
    a, b = [[0, half]], [[half, SIZE]]
    d = Driven(mode="sync", workers=2, optim=SGD, quorum=2)
    w0, (g0, g1, g2) = d.weights, grads(3)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0[:half], fields={"fragment": a})
    d.send(0, MsgType.PUSH, clock=1, tensor=g1[half:], fields={"fragment": b})  # its next fragment, the same merge
    assert d.counts()[1] == 0  # one worker of the two
    d.send(1, MsgType.PUSH, clock=0, tensor=g2[:half], fields={"fragment": a})
    pushes, updates, _, version = d.counts()
    assert (pushes, updates, version) == (3, 2, 2), d.counts()  # two fragments stepped: the version moves by two
    want = w0.clone()
    want[:half] -= (g0[:half] + g2[:half]) / 2
    want[half:] -= g1[half:]
    assert torch.allclose(d.weights, want, atol=1e-6), (d.weights - want).abs().max()
    d.send(1, MsgType.PUSH, clock=1, tensor=g0[half:], fields={"fragment": b})
    d.send(0, MsgType.PUSH, clock=2, tensor=g1)  # a whole push into a merge of fragments
    reply = d.net.out[-1]
    assert reply.type is MsgType.ERROR and "fragment" in str(reply.fields), reply.fields
    assert d.counts()[1] == 2  # nothing of it applied


def test_a_sync_clock_still_refuses_a_second_fragment():
    half = SIZE // 2
    d = Driven(mode="sync", workers=2, optim=SGD)
    w0, (g0, g1) = d.weights, grads(2)
    d.send(0, MsgType.PUSH, clock=0, tensor=g0[:half], fields={"fragment": [[0, half]]})
    d.send(1, MsgType.PUSH, clock=0, tensor=g1[half:], fields={"fragment": [[half, SIZE]]})
    reply = d.net.out[-1]
    assert reply.type is MsgType.ERROR and "same fragment" in str(reply.fields), reply.fields
    assert torch.equal(d.weights, w0) and d.counts()[1] == 0
