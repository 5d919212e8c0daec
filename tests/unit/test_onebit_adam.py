"""onebit_adam's parts alone: the server's step after the freeze against the formula, its settings'
one-line errors, WELCOME's `onebit`, and a push that disagrees with the freeze refused with nothing
applied (the whole system against a reference: tests/integration/test_onebit_adam.py)."""
from __future__ import annotations

import math

import pytest
import torch

from psrv.config import ConfigError, OptimConfig, RunConfig, ServerConfig, from_dict
from psrv.client.onebit import from_welcomes
from psrv.protocol import ErrorCode, MsgType
from psrv.server.shard import Shard
from tests.unit.test_state_dict import SIZE, Svc, g

ONEBIT = OptimConfig(name="onebit_adam", lr=0.01, weight_decay=0.1, freeze_step=2)


def test_after_the_freeze_the_mean_momentum_steps_over_the_frozen_variance():
    """Steps 1..K are torch's AdamW; then exp_avg is the pushed mean momentum, exp_avg_sq stays and
    w <- w(1 - lr wd) - lr/(1 - b1^t) m / (sqrt(v_K)/sqrt(1 - b2^K) + eps)."""
    shard, ref = Shard(SIZE, ONEBIT), torch.nn.Parameter(torch.linspace(0, 1, SIZE))
    shard.init(ref.detach())
    adamw = torch.optim.AdamW([ref], lr=ONEBIT.lr, weight_decay=ONEBIT.weight_decay)
    for k in (1, 2):
        shard.apply(g(k))
        ref.grad = g(k)
        adamw.step()
    assert torch.equal(shard.weights, ref.detach())
    v = adamw.state[ref]["exp_avg_sq"].clone()
    w = ref.detach().clone()
    for t, m in ((3, g(0.5)), (4, g(-0.25))):
        shard.apply(m)
        (b1, b2), lr = ONEBIT.betas, ONEBIT.lr
        w = w * (1 - lr * ONEBIT.weight_decay) - lr / (1 - b1 ** t) * m / (v.sqrt() / math.sqrt(1 - b2 ** 2) + ONEBIT.eps)
        torch.testing.assert_close(shard.weights, w, rtol=1e-6, atol=1e-7)
    state = shard.optimizer.state_dict()["state"][0]
    assert torch.equal(state["exp_avg_sq"], v) and torch.equal(state["exp_avg"], g(-0.25)) and int(state["step"]) == 4


def test_after_the_freeze_a_coordinate_whose_gradient_was_always_zero_stays_put():
    """v_K = 0 where every warm-up gradient was exactly 0 (a constant-zero input's weights): the momentum
    there is masked to 0 (DeepSpeed's exp_avg_mask, taken from v), so only the weight decay moves it,
    however large the pushed (sign-compressed) momentum says it is; elsewhere the formula above."""
    shard, ref = Shard(SIZE, ONEBIT), torch.nn.Parameter(torch.linspace(0, 1, SIZE))
    shard.init(ref.detach())
    adamw = torch.optim.AdamW([ref], lr=ONEBIT.lr, weight_decay=ONEBIT.weight_decay)
    zero = torch.tensor([True, False, False, False, False, True, False, False])
    for k in (1, 2):
        grad = torch.where(zero, 0.0, g(k))
        shard.apply(grad)
        ref.grad = grad
        adamw.step()
    v = adamw.state[ref]["exp_avg_sq"].clone()
    assert torch.equal(v == 0, zero)
    w = ref.detach().clone()
    for t, m in ((3, g(0.5)), (4, g(-0.25))):  # non-zero everywhere, as a scaled sign is
        shard.apply(m)
        (b1, b2), lr = ONEBIT.betas, ONEBIT.lr
        masked = torch.where(zero, 0.0, m)
        denom = v.sqrt() / math.sqrt(1 - b2 ** 2) + ONEBIT.eps
        w = w * (1 - lr * ONEBIT.weight_decay) - lr / (1 - b1 ** t) * masked / denom
        torch.testing.assert_close(shard.weights, w, rtol=1e-6, atol=1e-7)
    assert torch.equal(shard.optimizer.state_dict()["state"][0]["exp_avg"], torch.where(zero, 0.0, g(-0.25)))


@pytest.mark.parametrize("data, key", [
    ({"optimizer": {"name": "onebit_adam"}, "mode": "sync"}, "freeze_step"),
    ({"optimizer": {"name": "adam", "freeze_step": 5}, "mode": "sync"}, "freeze_step"),
    ({"optimizer": {"name": "onebit_adam", "freeze_step": 5}, "mode": "async"}, "optimizer.name"),
    ({"optimizer": {"name": "onebit_adam", "freeze_step": 5}, "mode": "ddp"}, "optimizer.name"),
    ({"optimizer": {"name": "onebit_adam", "freeze_step": 5}, "mode": "sync", "backup_workers": 1,
      "cluster": {"workers": 2}}, "optimizer.name"),
    ({"optimizer": {"name": "onebit_adam", "freeze_step": 5}, "mode": "sync", "worker": {"local_steps": 4}},
     "optimizer.name"),
    ({"optimizer": {"name": "onebit_adam", "freeze_step": 5, "update_rule": "staleness-lr"}, "mode": "sync"},
     "update_rule")], ids=["no-freeze-step", "freeze-step-without-onebit", "async", "ddp", "backup-workers",
                           "local-steps", "update-rule"])
def test_settings_onebit_adam_cannot_run_with_are_one_line_errors(data, key):
    with pytest.raises(ConfigError, match=key) as err:
        from_dict(RunConfig, data)
    assert "\n" not in str(err.value)


def test_welcome_says_onebit_and_a_push_against_the_freeze_is_refused_untouched():
    s = Svc(optim=ONEBIT)
    assert s.hello(0).fields["onebit"] == {"freeze_step": 2, "beta1": 0.9}
    assert Svc().hello(0).fields["onebit"] is None
    s.hello(1)
    s.req(MsgType.INIT, 0, seq=2, tensor=torch.linspace(0, 1, SIZE))
    before = s.weights
    for clock, fields in ((0, {"momentum": True}), (2, {})):  # a momentum in the warm-up, a gradient after
        reply = s.req(MsgType.PUSH, 0, seq=3 + clock, clock=clock, tensor=g(1), **fields)
        assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.NOT_ALLOWED
        assert "freeze_step 2" in reply.fields["message"]
    assert torch.equal(s.weights, before) and s.svc.shard.version == 0
    plain = Svc(optim=ServerConfig().optimizer)
    plain.hello(0)
    plain.req(MsgType.INIT, 0, seq=2, tensor=torch.linspace(0, 1, SIZE))
    reply = plain.req(MsgType.PUSH, 0, seq=3, clock=0, tensor=g(1), momentum=True)
    assert reply.fields["code"] == ErrorCode.NOT_ALLOWED and "not onebit_adam" in reply.fields["message"]


def test_a_worker_keeps_its_momentum_as_welcome_says_and_refuses_shards_that_disagree():
    assert from_welcomes([{"onebit": None}, {"onebit": None}], 4) is None
    local = from_welcomes([{"onebit": {"freeze_step": 3, "beta1": 0.5}}] * 2, 4)
    local.update(torch.tensor([1.0, 2.0, 3.0, 4.0]), 0, 2)  # shard 0's range only
    assert torch.equal(local.momentum, torch.tensor([0.5, 1.0, 0.0, 0.0]))
    assert [local.is_momentum(c) for c in (2, 3)] == [False, True]
    again = from_welcomes([{"onebit": {"freeze_step": 3, "beta1": 0.5}}], 4)
    again.load_state_dict(local.state_dict())
    assert torch.equal(again.momentum, local.momentum)
    with pytest.raises(ValueError, match="disagree"):
        from_welcomes([{"onebit": {"freeze_step": 3, "beta1": 0.5}}, {"onebit": None}], 4)
