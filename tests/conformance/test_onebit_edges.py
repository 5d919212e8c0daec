"""What the matrix's onebit_adam cases cannot show, found by `make mutants`: a push whose kind (gradient or
momentum) disagrees with its clock, or a momentum where the shard runs another optimizer, is refused
NOT_ALLOWED with a message that says which and why, and changes nothing (the matrix's workers always follow
WELCOME's onebit). The shard is driven by hand (tests/unit/test_push_whole.Driven)."""
from __future__ import annotations

import pytest
import torch

from psrv.config import OptimConfig
from psrv.protocol import ErrorCode, MsgType
from tests.unit.test_push_whole import Driven, grads

ONEBIT = OptimConfig(name="onebit_adam", lr=0.01, freeze_step=2)


@pytest.mark.parametrize("optim, clock, momentum, message", [
    (OptimConfig(name="sgd", lr=0.1), 0, True, "a momentum push, but this server runs sgd, not onebit_adam"),
    (ONEBIT, 2, False, "onebit_adam with freeze_step 2: clock 2's push must be a momentum; the worker must "
                       "follow WELCOME's onebit"),
    (ONEBIT, 1, True, "onebit_adam with freeze_step 2: clock 1's push must be a gradient; the worker must "
                      "follow WELCOME's onebit"),
])
def test_a_push_of_the_wrong_kind_is_refused_and_changes_nothing(optim, clock, momentum, message):
    d = Driven(mode="sync", workers=1, optim=optim)
    before = d.weights
    d.send(0, MsgType.PUSH, clock=clock, tensor=grads(1)[0], fields={"momentum": True} if momentum else {})
    reply = d.net.out[-1]
    assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.NOT_ALLOWED, reply.fields
    assert reply.fields["message"] == message
    assert torch.equal(d.weights, before) and d.counts()[1] == 0


def test_the_right_kinds_are_taken():
    d = Driven(mode="sync", workers=1, optim=ONEBIT)
    for clock in range(4):
        d.send(0, MsgType.PUSH, clock=clock, tensor=grads(1)[0], fields={"momentum": True} if clock >= 2 else {})
        assert d.net.out[-1].type is MsgType.OK, d.net.out[-1].fields
    assert d.counts()[1] == 4
