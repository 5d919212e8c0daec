"""Server-side update rules (psrv/server/rules): each reduces to plain where it should, and applies
its formula exactly on hand-checked cases; their state survives a state_dict round trip."""
import math

import pytest
import torch

from psrv.config import ConfigError, OptimConfig
from psrv.config.optimizer import NESTEROV_RULES, UPDATE_RULES
from psrv.server.rules import RULES, PushContext
from psrv.server.shard import Shard

SIZE = 1000


def shard(rule="plain", **kw):
    kw = {"lr": 0.1, "momentum": 0.9, **({"nesterov": True} if rule in NESTEROV_RULES else {}), **kw}
    s = Shard(SIZE if "size" not in kw else kw.pop("size"), OptimConfig("sgd", update_rule=rule, **kw))
    s.init(torch.randn(s.size, generator=torch.Generator().manual_seed(1)))
    return s


def pushes(n=8):
    gen = torch.Generator().manual_seed(2)
    return [(torch.randn(SIZE, generator=gen), i % 3, i % 5) for i in range(n)]  # (grad, worker, staleness)


def run(s, seq, *, stale=True):
    for grad, worker, tau in seq:  # each worker pulls after its push; the others' pushes come between
        s.apply(grad, PushContext(worker, clock=0, base_version=max(0, s.version - tau),
                                  staleness=tau if stale else 0))
        s.pulled(worker)
    return s.param.data


def test_registry_matches_the_config_tree():
    assert set(RULES) == set(UPDATE_RULES)


def test_defaults_and_errors():
    assert OptimConfig(update_rule="dc-asgd").dc_lambda == 0.04
    assert OptimConfig(update_rule="dc-asgd-a").dc_lambda == 2.0
    assert OptimConfig(update_rule="dc-asgd", dc_lambda=0.5).dc_lambda == 0.5
    assert OptimConfig().update_rule == "plain" and OptimConfig().dc_lambda == 0.0
    with pytest.raises(ConfigError, match="dc_lambda: only used by update_rule dc-asgd"):
        OptimConfig(update_rule="staleness-lr", dc_lambda=0.1)
    with pytest.raises(ConfigError, match="update_rule"):
        OptimConfig(update_rule="nope")


def test_staleness_lr_at_zero_and_dc_at_lambda_zero_are_plain_bit_for_bit():
    seq = pushes()
    plain = run(shard(), seq)
    assert torch.equal(run(shard("staleness-lr"), seq, stale=False), plain)
    assert torch.equal(run(shard("dc-asgd", dc_lambda=0.0), seq), plain)
    assert not torch.equal(run(shard("staleness-lr"), seq), plain)  # the test can tell them apart
    assert not torch.equal(run(shard("dc-asgd"), seq), plain)


def test_staleness_lr_divides_the_gradient_by_tau():
    s = shard("staleness-lr", momentum=0.0)
    w0 = s.param.data.clone()
    g = torch.randn(SIZE, generator=torch.Generator().manual_seed(3))
    scale = s.apply(g, PushContext(0, clock=5, base_version=2, staleness=3))
    assert scale == pytest.approx(1 / 3)
    assert torch.equal(s.param.data, w0.clone().add_(g / 3, alpha=-0.1))
    torch.testing.assert_close(s.param.data, w0 - 0.1 * g / 3, rtol=0, atol=1e-6)
    assert s.apply(g.to(torch.bfloat16), PushContext(0, staleness=1)) == 1.0  # τ=1: untouched (cast path)


def test_staleness_lr_under_momentum_scales_what_enters_the_buffer():
    s = shard("staleness-lr", size=2, lr=1.0, momentum=0.5)
    s.init(torch.zeros(2))
    s.apply(torch.tensor([4.0, 8.0]), PushContext(0, staleness=4))  # buffer [1, 2]
    s.apply(torch.tensor([2.0, 2.0]), PushContext(0, staleness=2))  # buffer 0.5*[1,2] + [1,1] = [1.5, 2]
    assert torch.equal(s.param.data, torch.tensor([-2.5, -4.0]))
    assert torch.equal(s.optimizer.state["momentum_buffer"], torch.tensor([1.5, 2.0]))


def test_dc_asgd_on_a_hand_case():
    # w_bak = [1, 2], w = [1.5, 1], g = [2, -1], λ = 0.25:
    # λ·g⊙g⊙(w − w_bak) = 0.25·[4, 1]·[0.5, -1] = [0.5, -0.25]; g' = [2.5, -1.25]
    # lr 0.5, momentum 0: w' = [1.5 − 1.25, 1 + 0.625] = [0.25, 1.625]
    s = shard("dc-asgd", size=2, lr=0.5, momentum=0.0, dc_lambda=0.25)
    s.init(torch.tensor([1.0, 2.0]))
    s.pulled(7)
    s.init(torch.tensor([1.5, 1.0]))
    s.apply(torch.tensor([2.0, -1.0]), PushContext(7, staleness=3))
    assert torch.equal(s.param.data, torch.tensor([0.25, 1.625]))
    s.init(torch.tensor([1.5, 1.0]))  # a worker with no recorded pull, and a sync mean: no correction
    s.apply(torch.tensor([2.0, -1.0]), PushContext(3, staleness=3))
    s.apply(torch.tensor([0.0, 0.0]), PushContext())
    assert torch.equal(s.param.data, torch.tensor([0.5, 1.5]))


def test_dc_asgd_adaptive_lambda_on_a_hand_case():
    # m = 0.95, λ0 = 2, g = [2, -1]: MeanSquare = 0.05·[4, 1] = [0.2, 0.05],
    # λ_t = 2/√[0.2, 0.05] = [4.472136, 8.944272]; correction λ_t·g²·(w − w_bak) = [8.944272, −8.944272]
    s = shard("dc-asgd-a", size=2, lr=1.0, momentum=0.0)
    s.init(torch.tensor([1.0, 2.0]))
    s.pulled(0)
    s.init(torch.tensor([1.5, 1.0]))
    s.apply(torch.tensor([2.0, -1.0]), PushContext(0, staleness=1))
    torch.testing.assert_close(s.rule.mean_square, torch.tensor([0.2, 0.05]))
    lam = [2 / math.sqrt(0.2), 2 / math.sqrt(0.05)]
    assert lam == pytest.approx([4.472136, 8.944272], rel=1e-6)
    want = torch.tensor([1.5 - (2 + lam[0] * 4 * 0.5), 1.0 - (-1 + lam[1] * 1 * -1)])
    torch.testing.assert_close(s.param.data, want, rtol=1e-6, atol=1e-6)
    s.apply(torch.tensor([0.0, 0.0]), PushContext(0, staleness=1))  # the average decays by m
    torch.testing.assert_close(s.rule.mean_square, torch.tensor([0.19, 0.0475]))


def test_sync_mean_is_plain_for_every_rule():
    gen = torch.Generator().manual_seed(4)
    grads = [torch.randn(SIZE, generator=gen) for _ in range(6)]
    results = []
    for rule in UPDATE_RULES:  # dn needs nesterov: its sync step (N = 1) is tests/unit/test_dn_rule.py's; heloco
        if rule in NESTEROV_RULES:  # is refused in sync (a staleness rule)
            continue
        s = shard(rule)
        for i in range(0, 6, 2):
            s.pulled(0)
            s.accumulate(grads[i])
            s.accumulate(grads[i + 1])
            assert s.apply_accumulated() == 2
        results.append(s.param.data)
    assert all(torch.equal(r, results[0]) for r in results)


@pytest.mark.parametrize("rule", UPDATE_RULES)
def test_rule_state_survives_a_state_dict_round_trip(rule):
    seq = pushes(6)
    a = shard(rule)
    run(a, seq)
    b = shard(rule)
    b.load_state_dict(a.state_dict())
    assert b.state_dict()["rule"]["name"] == rule
    if rule.startswith("dc"):
        assert set(b.rule.pulled_weights) == {0, 1, 2}
    more = pushes(12)[6:]  # no pulls in between: the restored w_bak must be the saved ones
    for s in (a, b):
        for grad, worker, tau in more:
            s.apply(grad, PushContext(worker, staleness=tau))
    assert torch.equal(a.param.data, b.param.data)


def test_another_rules_state_is_not_loaded():
    a = shard("dc-asgd-a")
    run(a, pushes(3))
    b = shard("dc-asgd")
    b.load_state_dict(a.state_dict())
    assert b.rule.pulled_weights == {} and torch.equal(b.param.data, a.param.data)


def test_lr_scale_is_counted_in_the_stats_and_prometheus():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from psrv.metrics import ServerMetrics
    from psrv.server.counters import ShardStats

    registry = CollectorRegistry()
    stats = ShardStats(metrics=ServerMetrics(registry, shard=0, mode="async"))
    s = shard("staleness-lr")
    for tau in (0, 1, 3, 3, 2):
        stats.applied(s.version, lr_scale=s.apply(torch.ones(SIZE), PushContext(0, staleness=tau)))
    out = stats.to_dict()
    assert out["lr_scale_histogram"] == {"1": 2, "0.5": 1, "0.333333": 2}
    assert out["mean_lr_scale"] == pytest.approx((2 + 0.5 + 2 / 3) / 5)
    got = {(x.name, x.labels.get("le")): x.value for f in text_string_to_metric_families(
        generate_latest(registry).decode()) for x in f.samples if x.name.startswith("psrv_lr_scale")}
    assert got[("psrv_lr_scale_count", None)] == 5
    assert got[("psrv_lr_scale_bucket", "0.3333333333333333")] == 2 and got[("psrv_lr_scale_bucket", "0.5")] == 3


def test_cgad_defaults_and_refusals():
    o = OptimConfig("adam", update_rule="cgad")
    assert (o.cgad_alpha, o.cgad_cutoff) == (0.1, 16)
    assert (OptimConfig().cgad_alpha, OptimConfig().cgad_cutoff) == (0.0, 0)
    for key in ("cgad_alpha", "cgad_cutoff"):
        with pytest.raises(ConfigError, match=f"{key}: only used by update_rule cgad"):
            OptimConfig(update_rule="staleness-lr", **{key: 1})


def test_cgad_scale_is_its_formula():
    from psrv.server.rules.cgad import cgad_scale
    assert cgad_scale(0, 0.1, 16) == 1.0  # a fresh push: plain (the paper's sigma(0) = 1)
    assert cgad_scale(3, 0.1, 16) == pytest.approx((1 + math.cos(math.pi * 3 / 16)) / 2 * math.exp(-0.3))
    assert cgad_scale(8, 0.0, 16) == pytest.approx(0.5)  # the gate's half-way point
    assert cgad_scale(16, 0.1, 16) == 0.0 and cgad_scale(40, 0.1, 16) == 0.0  # at and past the cutoff
    assert cgad_scale(40, 0.1, 0) == pytest.approx(math.exp(-4.0))  # no gate: Adam-Decay


def test_cgad_with_its_knobs_at_zero_is_plain_bit_for_bit_and_otherwise_scales_what_enters_adam():
    seq = pushes()
    for name in ("sgd", "adam"):
        kw = {"momentum": 0.0} if name == "adam" else {}
        def make(rule, **more):
            s = Shard(SIZE, OptimConfig(name, lr=0.01, update_rule=rule, **kw, **more))
            s.init(torch.randn(SIZE, generator=torch.Generator().manual_seed(1)))
            return s
        plain = run(make("plain"), seq)
        assert torch.equal(run(make("cgad", cgad_alpha=0.0, cgad_cutoff=0), seq), plain)
        assert torch.equal(run(make("cgad"), seq, stale=False), plain)  # every push fresh
        assert not torch.equal(run(make("cgad"), seq), plain)  # the test can tell them apart
    # Adam's moments take sigma * g: one push of age 2, alpha ln 2, no gate -> g / 4 into m and v
    s = Shard(2, OptimConfig("adam", lr=1.0, update_rule="cgad", cgad_alpha=math.log(2), cgad_cutoff=0))
    s.init(torch.zeros(2))
    assert s.apply(torch.tensor([4.0, -8.0]), PushContext(0, staleness=2)) == pytest.approx(0.25)
    torch.testing.assert_close(s.optimizer.state["exp_avg"], torch.tensor([0.1, -0.2]))
