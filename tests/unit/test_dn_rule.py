"""The `dn` rule (delayed Nesterov, psrv/server/rules/dn.py): N = 1 is the server's SGD-Nesterov,
momentum 0 is plain SGD at lr/N, N = 2 follows the formula push by push, and its setting resolves."""
import pytest
import torch

from psrv.config import ConfigError, OptimConfig, RunConfig, ServerConfig
from psrv.config.base import from_dict
from psrv.server.rules import PushContext
from psrv.server.shard import Shard

SIZE = 1000


def shard(rule="dn", size=SIZE, **kw):
    s = Shard(size, OptimConfig("sgd", update_rule=rule, **{"lr": 0.1, "momentum": 0.9, "nesterov": True, **kw}))
    s.init(torch.randn(size, generator=torch.Generator().manual_seed(1)))
    return s


def grads(n=8):
    gen = torch.Generator().manual_seed(2)
    return [torch.randn(SIZE, generator=gen) for _ in range(n)]


def run(s, seq):
    for i, g in enumerate(seq):
        s.apply(g, PushContext(i % 3, staleness=i % 4))
    return s.param.data


def test_period_one_is_sgd_nesterov_bit_for_bit():
    seq = grads()
    assert torch.equal(run(shard(dn_period=1), seq), run(shard("plain"), seq))
    assert torch.equal(run(shard(dn_period=1, weight_decay=0.01), seq), run(shard("plain", weight_decay=0.01), seq))
    assert not torch.equal(run(shard(dn_period=2), seq), run(shard("plain"), seq))  # the test can tell


def test_sync_clock_is_sgd_nesterov():
    seq = grads(6)
    a, b = shard(), shard("plain")
    for s in (a, b):
        for i in range(0, 6, 2):
            s.accumulate(seq[i])
            s.accumulate(seq[i + 1])
            s.apply_accumulated()
    assert torch.equal(a.param.data, b.param.data)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_momentum_zero_is_plain_sgd_at_lr_over_n(n):
    seq = grads()
    s = shard(dn_period=n)
    object.__setattr__(s.optim_cfg, "momentum", 0.0)  # the config refuses nesterov at 0; the rule reads it
    plain = shard("plain", lr=0.1 / n, momentum=0.0, nesterov=False)
    torch.testing.assert_close(run(s, seq), run(plain, seq), rtol=0, atol=1e-7)


def test_period_two_follows_the_formula():
    lr, beta = 0.5, 0.9
    s = shard(size=2, dn_period=2, lr=lr, momentum=beta)
    w0 = torch.tensor([1.0, -2.0])
    s.init(w0)
    d = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0]), torch.tensor([-2.0, 0.5]), torch.tensor([0.5, 4.0])]
    w1 = w0 - lr * d[0] / 2                         # t = 1: no momentum
    m2 = (d[0] + d[1]) / 2                          # t = 2: m = β·0 + Δ_sum/N
    w2 = w1 - lr * (d[1] / 2 + beta * m2)
    w3 = w2 - lr * d[2] / 2                         # t = 3: no momentum
    m4 = beta * m2 + (d[2] + d[3]) / 2              # t = 4
    w4 = w3 - lr * (d[3] / 2 + beta * m4)
    for g, want in zip(d, (w1, w2, w3, w4)):
        assert s.apply(g, PushContext(0)) == 0.5    # the lr scale recorded: 1/N
        torch.testing.assert_close(s.param.data, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(s.rule.momentum, m4)
    assert s.rule.pushes == 4 and torch.equal(s.rule.buffered, torch.zeros(2))


def test_state_survives_a_round_trip_mid_period():
    seq = grads(11)
    a = shard(dn_period=4)
    run(a, seq[:5])
    b = shard(dn_period=4)
    b.load_state_dict(a.state_dict())
    assert b.rule.pushes == 5 and torch.equal(b.rule.buffered, a.rule.buffered)
    assert torch.equal(b.rule.momentum, a.rule.momentum)
    assert torch.equal(run(a, seq[5:]), run(b, seq[5:]))
    c = shard("plain")
    c.load_state_dict(a.state_dict())  # another rule's state is not loaded
    assert torch.equal(c.param.data, a.param.data)


def test_setting_resolves_and_refuses():
    def server(mode="async", workers=4, **optim):
        return ServerConfig(mode=mode, workers=workers, optimizer=OptimConfig(update_rule="dn", nesterov=True, **optim))
    assert server().optimizer.dn_period == 4
    assert server(dn_period=3).optimizer.dn_period == 3
    assert server(mode="sync").optimizer.dn_period == 1
    with pytest.raises(ConfigError, match="dn_period: in mode 'sync'"):
        server(mode="sync", dn_period=2)
    with pytest.raises(ConfigError, match="dn_period: in mode 'sync'"):
        from_dict(RunConfig, {"mode": "sync", "optimizer": {"update_rule": "dn", "nesterov": True, "dn_period": 2}})
    with pytest.raises(ConfigError, match="update_rule: dn is delayed Nesterov"):
        OptimConfig(update_rule="dn")
    with pytest.raises(ConfigError, match="update_rule: dn is delayed Nesterov"):
        OptimConfig("adam", update_rule="dn")
    with pytest.raises(ConfigError, match="dn_period: only used by update_rule dn"):
        OptimConfig(dn_period=2)
