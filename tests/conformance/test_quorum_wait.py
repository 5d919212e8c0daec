"""`--quorum-wait`: a quorum's fresh pushes (on the latest merge's weights) fill its merge and hold their pulls until
it closes; older pushes join it uncounted and are answered at once (psrv/server/consistency/quorum.py). A shard
driven by hand (tests/unit/test_push_whole.Driven): which PUSH_PULLs are answered, when, at which version, and the
merge's weights against the weighted mean by hand. The turns of the conformance matrix (axis `wait`) check the
same against tests/conformance/reference.py; the history checker's rule 3 checks it in real runs."""
from __future__ import annotations

import torch

from psrv.config import OptimConfig
from psrv.protocol import MsgType
from psrv.server.consistency.quorum import QuorumController
from tests.unit.test_push_whole import Driven, grads

SGD = OptimConfig(name="sgd", lr=1.0, momentum=0.0)


def answered(d: Driven) -> dict[int, int]:
    """worker -> the version its WEIGHTS answer carried, for the answers sent since the last call (an answer
    names its request's seq, and push() gives worker w the seqs 1000 (w + 1) + k)."""
    out = {m.seq // 1000 - 1: m.fields["version"] for m in d.net.out if m.type is MsgType.WEIGHTS}
    d.net.out.clear()
    return out


def push(d: Driven, worker: int, grad: torch.Tensor, base: int, clock: int) -> None:
    d.send(worker, MsgType.PUSH_PULL, seq=1000 * (worker + 1) + clock, clock=clock, base_version=base, tensor=grad)


def test_fresh_pushes_wait_for_their_merge_and_a_late_one_joins_the_next_uncounted():
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=2, quorum_wait=True)
    w0, (a, b, late, a2, b2) = d.weights, grads(5)
    push(d, 0, a, base=0, clock=0)
    assert answered(d) == {}  # fresh, alone in its merge: held
    push(d, 1, b, base=0, clock=0)
    assert answered(d) == {0: 1, 1: 1}  # the second fresh push closes it: both answered from its version
    w1 = w0 - (a + b) / 2
    assert torch.allclose(d.weights, w1, atol=1e-6)
    push(d, 2, late, base=0, clock=0)  # on version 0, one merge old
    assert answered(d) == {2: 1} and d.counts()[1] == 1  # answered at once, and fills nothing
    push(d, 0, a2, base=1, clock=1)
    assert answered(d) == {} and d.counts()[1] == 1  # one fresh push and one old: not Q fresh ones
    push(d, 1, b2, base=1, clock=1)
    assert answered(d) == {0: 2, 1: 2}  # the old push merged beside the two fresh ones
    assert torch.allclose(d.weights, w1 - (late + a2 + b2) / 3, atol=1e-6)


def test_without_wait_the_same_pushes_are_answered_at_once_and_the_old_one_counts():
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=2)
    a, b, late, a2 = grads(4)
    push(d, 0, a, base=0, clock=0)
    assert answered(d) == {0: 0}
    push(d, 1, b, base=0, clock=0)
    push(d, 2, late, base=0, clock=0)
    push(d, 0, a2, base=1, clock=1)
    assert d.counts()[1] == 2  # the old push and a fresh one: Q workers


def test_a_push_without_a_gradient_is_answered_at_once():
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=2, quorum_wait=True, nonfinite="skip")
    nan = torch.full_like(grads(1)[0], float("nan"))
    push(d, 0, nan, base=0, clock=0)
    assert answered(d) == {0: 0}


def test_a_worker_that_leaves_lets_the_held_merge_close():
    d = Driven(mode="sync", workers=3, optim=SGD, quorum=3, quorum_wait=True)
    a, b = grads(2)
    push(d, 0, a, base=0, clock=0)
    push(d, 1, b, base=0, clock=0)
    assert answered(d) == {}
    d.send(2, MsgType.LEAVE)
    assert answered(d) == {0: 1, 1: 1}  # every worker still pushing is in: it merges


def test_the_held_workers_travel_in_the_state():
    c = QuorumController(3, quorum=2, wait=True)
    c.push(0, 0, age=0)
    assert not c.pull_ready(0, 1) and c.pull_ready(1, 0)
    loaded = QuorumController(3, quorum=2, wait=True)
    loaded.load_state_dict(c.state_dict())
    assert loaded.state_dict() == c.state_dict() and not loaded.pull_ready(0, 1)
    c.push(1, 0, age=0)
    assert c.commit_ready()
    c.committed()
    assert c.pull_ready(0, 1) and c.pull_ready(1, 1)
