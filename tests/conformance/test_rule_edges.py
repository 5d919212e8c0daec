"""What no case of the matrix can show about the shard's update math, found by `make mutants`
(tests/conformance/mutants.py): a rule's state is float32 whatever torch's default dtype is and lives on the
shard's device; a DC-ASGD push from a worker the shard never answered a pull is plain, at lr scale 1; and
1-bit Adam frozen after a single Adam step (the matrix's cases freeze at 2) matches its reference."""
import re
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from psrv.config import OptimConfig
from psrv.server.rules import PushContext, make_rule
from psrv.server.shard import Shard

SIZE = 1000
RULES = {"dc-asgd": {}, "dc-asgd-a": {}, "dn": {"nesterov": True, "dn_period": 2},
         "heloco": {"nesterov": True, "heloco_block": 300}}


def shard(rule: str, **kw) -> Shard:
    s = Shard(SIZE, OptimConfig("sgd", lr=0.1, momentum=0.9, update_rule=rule, **{**RULES.get(rule, {}), **kw}))
    s.init(randn(1))
    return s


def randn(seed: int) -> torch.Tensor:
    return torch.randn(SIZE, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def steps(s: Shard, n: int = 6) -> torch.Tensor:
    """n pushes from three workers, each pulling after its own push (DC-ASGD's w_bak)."""
    for w in range(3):
        s.pulled(w)
    for i in range(n):
        s.apply(randn(10 + i), PushContext(i % 3, staleness=i % 4))
        s.pulled(i % 3)
    return s.param.data.clone()


@pytest.mark.parametrize("rule", RULES)
def test_a_float64_default_dtype_changes_no_bit(rule):
    """The shard computes in float32 (its weights' dtype) even in a host that made float64 torch's default:
    every buffer a rule keeps is made float32, and the weights after the same pushes are bit for bit."""
    want = steps(shard(rule))
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        s = shard(rule)
        got = steps(s)
    finally:
        torch.set_default_dtype(before)
    kept = {k: v.dtype for k, v in s.rule.state_dict().items() if isinstance(v, torch.Tensor)}
    assert all(d == torch.float32 for d in kept.values()), kept
    assert torch.equal(got, want), f"{(got - want).abs().max().item():.3g} from the float32 default's weights"


@pytest.mark.parametrize("rule", ["dc-asgd", "dc-asgd-a"])
def test_a_push_before_any_pull_is_plain(rule):
    """No w_bak for that worker, so no correction: the plain rule's step and lr scale 1 (a psrv.Worker pulls
    first, so only a client that pushes first gets here)."""
    grad = randn(3)
    s, plain = shard(rule), shard("plain")
    assert s.apply(grad, PushContext(0, staleness=2)) == 1.0
    plain.apply(grad, PushContext(0, staleness=2))
    assert torch.equal(s.param.data, plain.param.data)


@pytest.mark.parametrize("rule", RULES)
def test_every_buffer_is_made_and_restored_on_the_shards_device(rule):
    """A rule keeps its buffers on its shard's device (a GPU shard's). The matrix runs on the CPU, where a
    tensor made without `device=` lands as well, so here the device is `meta` (shapes, no data): every
    buffer a rule makes while stepping, and every one it restores from a CPU checkpoint, must be there."""
    meta = torch.device("meta")
    cfg = OptimConfig("sgd", lr=0.1, momentum=0.9, update_rule=rule, **RULES[rule])
    r = make_rule(cfg, SIZE, meta)
    weights, grad = torch.zeros(SIZE, device=meta), torch.ones(SIZE, device=meta)
    optimizer = SimpleNamespace(param=SimpleNamespace(data=weights), lr=0.1, step=lambda g: weights.sub_(g))
    for i in range(4 if rule != "heloco" else 0):  # heloco reads each block's norms as numbers, which a meta
        r.pulled(i % 2, weights)                   # tensor has none: its buffers as made and restored are checked
        prepared, _ = r.prepare(grad, PushContext(i % 2, staleness=1), weights,
                                lambda: torch.empty(SIZE, device=meta))
        r.step(prepared, optimizer)
    made = {k: v.device for k, v in vars(r).items() if isinstance(v, torch.Tensor)}
    made |= {f"pulled[{w}]": t.device for w, t in getattr(r, "pulled_weights", {}).items()}
    assert made and set(made.values()) == {meta}, made

    on_cpu = shard(rule)
    steps(on_cpu)
    restored = make_rule(cfg, SIZE, meta)
    restored.load_state_dict(on_cpu.rule.state_dict())
    kept = {k: v.device for k, v in restored.state_dict().items() if isinstance(v, torch.Tensor)}
    kept |= {f"pulled[{w}]": t.device for w, t in restored.state_dict().get("pulled", {}).items()}
    assert kept and set(kept.values()) == {meta}, kept


STATE_KEYS = {"dc-asgd": ("pulled",), "dc-asgd-a": ("pulled", "mean_square"), "dn": ("momentum", "buffered"),
              "heloco": ("momentum",)}


@pytest.mark.parametrize("rule", RULES)
def test_a_restored_state_is_checked_and_made_float32(rule):
    """What a checkpoint may hold that the matrix's resume cases never do: a state of another shard's size is
    refused naming the key and both sizes, one written in float64 is restored as float32, and a DC-ASGD
    state without one of its keys restores that part as a fresh rule's."""
    want = shard(rule)
    steps(want)
    state = want.rule.state_dict()
    for key in STATE_KEYS[rule]:
        bad = {**state, key: {0: torch.zeros(3)} if key == "pulled" else torch.zeros(3)}
        where = "pulled[0]" if key == "pulled" else key
        with pytest.raises(ValueError, match=rf"^rule state {re.escape(where)} has shape \(3,\), this shard {SIZE}$"):
            make_rule(want.rule.cfg, SIZE, torch.device("cpu")).load_state_dict(bad)

    as64 = {k: ({w: t.double() for w, t in v.items()} if k == "pulled" else
                v.double() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    restored = make_rule(want.rule.cfg, SIZE, torch.device("cpu"))
    restored.load_state_dict(as64)
    kept = {k: v.dtype for k, v in restored.state_dict().items() if isinstance(v, torch.Tensor)}
    kept |= {f"pulled[{w}]": t.dtype for w, t in restored.state_dict().get("pulled", {}).items()}
    assert kept and set(kept.values()) == {torch.float32}, kept

    if rule not in ("dn", "heloco"):  # dn's and heloco's states have always had all their keys
        fresh = make_rule(want.rule.cfg, SIZE, torch.device("cpu"))
        fresh.load_state_dict({"name": rule})
        assert fresh.pulled_weights == {}
        if rule == "dc-asgd-a":
            assert torch.equal(fresh.mean_square, torch.zeros(SIZE))


def test_onebit_adam_frozen_after_a_single_adam_step_matches_the_reference():
    """freeze_step 1, which no matrix case states (they freeze at 2): v is frozen after one Adam step, so the
    frozen step's bias correction is 1 - b2^1 (`make mutants` found a warm-up floor of 2 unnoticed); three
    clocks of momenta after it, against tests/conformance/ref_optim.py's 1-bit Adam."""
    from tests.conformance.ref_optim import ServerMath, settings
    o = OptimConfig("onebit_adam", lr=0.003, freeze_step=1)
    s = Shard(SIZE, o)
    s.init(randn(1))
    ref = ServerMath(settings(o), randn(1), workers=1, mode="sync")
    for i in range(4):
        push = randn(20 + i)
        s.accumulate(push, momentum=i >= 1)
        s.apply_accumulated()
        ref.step(push, worker=None, staleness=0, momentum_push=i >= 1)
    assert torch.allclose(s.param.data, ref.w, atol=1e-6, rtol=0), (s.param.data - ref.w).abs().max().item()
    assert not torch.allclose(ref.w, randn(1))  # the steps moved the weights


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_cgad_at_every_age_up_to_past_its_cutoff_matches_the_reference(optimizer):
    """The matrix's pushes are at most a few updates stale; here ages 0 to 7 against a cutoff of 4 (the gate's
    cosine below it, zero at and past it), the default cutoff and none, with each optimizer's lr scale, against
    tests/conformance/ref_optim.py's CGAD."""
    from tests.conformance.ref_optim import ServerMath, settings
    for alpha, cutoff in ((0.3, 4), (0.1, 16), (0.2, 0)):  # the last: no gate
        o = OptimConfig(optimizer, lr=0.05 if optimizer == "sgd" else 0.003, update_rule="cgad",
                        cgad_alpha=alpha, cgad_cutoff=cutoff)
        s = Shard(SIZE, o)
        s.init(randn(1))
        ref = ServerMath(settings(o), randn(1), workers=2, mode="async")
        scales = []
        for tau in range(8):
            push = randn(30 + tau)
            scales.append(s.apply(push, PushContext(tau % 2, staleness=tau)))
            ref.step(push, worker=tau % 2, staleness=tau)
        assert torch.allclose(s.param.data, ref.w, atol=1e-6, rtol=0), (s.param.data - ref.w).abs().max().item()
        assert Counter(f"{round(x, 6):g}" for x in scales) == ref.lr_scales
        assert scales[0] == 1.0 and (not cutoff or cutoff > 7 or scales[cutoff:] == [0.0] * (8 - cutoff)), scales
