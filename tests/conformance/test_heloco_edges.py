"""What the matrix's cases cannot show about heloco (psrv/server/rules/heloco.py), against
tests/conformance/ref_optim.py's HeLoCo: each of its three cases (kept, shrunk, turned) at knobs and block sizes the
cases do not take, with weight decay; its degenerate cases (no strength, or a keep threshold of -1, is the
uncorrected outer step); and that in the plan's own heloco cases the correction, not only the outer step, moves
the weights past the matrix's tolerance."""
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from psrv.config import OptimConfig
from psrv.server.rules import PushContext
from psrv.server.shard import Shard
from tests.conformance.axes import ATOL, HELOCO, RTOL, case_id, run_config
from tests.conformance.covering import load
from tests.conformance.ref_optim import ServerMath, settings
from tests.conformance.ref_streaming import reference_of

SIZE = 300


def randn(seed: int, size: int = SIZE) -> torch.Tensor:
    return torch.randn(size, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def pushes(n: int) -> list[torch.Tensor]:
    """Pushes that mostly follow one direction, some against it: every case of the rule is taken."""
    trend = randn(99)
    return [trend * (1.0 if i % 4 else -0.7) + randn(i) * 0.8 for i in range(n)]


def both(o: OptimConfig, seq) -> tuple[Shard, ServerMath]:
    s = Shard(SIZE, o)
    s.init(randn(1))
    ref = ServerMath(settings(o), randn(1), workers=2, mode="async")
    for i, push in enumerate(seq):
        s.apply(push, PushContext(i % 2, staleness=i % 3))
        ref.step(push, worker=i % 2, staleness=i % 3)
    return s, ref


KNOBS = [dict(heloco_keep=0.3, heloco_shrink=1.0, heloco_reorient=0.5, heloco_kappa=1.0, heloco_block=1 << 20),
         dict(heloco_keep=0.8, heloco_shrink=3.0, heloco_reorient=2.0, heloco_kappa=0.2, heloco_block=37),
         dict(heloco_keep=0.95, heloco_shrink=0.5, heloco_reorient=0.1, heloco_kappa=4.0, heloco_block=0),
         dict(heloco_keep=0.8, heloco_shrink=0.0, heloco_reorient=2.0, heloco_kappa=0.2, heloco_block=37)]


@pytest.mark.parametrize("knobs", KNOBS, ids=["defaults", "blocks-of-37", "whole-slice", "turn-only"])
@pytest.mark.parametrize("decay", [0.0, 0.01])
def test_heloco_matches_the_reference_in_each_of_its_cases(knobs, decay):
    o = OptimConfig("sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=decay, update_rule="heloco", **knobs)
    s, ref = both(o, pushes(12))
    assert torch.allclose(s.param.data, ref.w, atol=1e-6, rtol=0), (s.param.data - ref.w).abs().max().item()
    assert torch.allclose(s.rule.momentum, ref.heloco_m, atol=1e-6, rtol=0)
    assert Counter(s.rule.blocks) == ref.heloco_cases + Counter(dict.fromkeys(s.rule.blocks, 0))
    if knobs["heloco_block"] == 37 and knobs["heloco_shrink"]:  # every case taken, so a wrong one fails here
        assert min(s.rule.blocks.values()) > 0, s.rule.blocks
    if not knobs["heloco_shrink"]:  # a block against the momentum is kept, never turned instead
        assert s.rule.blocks["shrunk"] == 0 and ref.heloco_cases["kept"] > 9, (s.rule.blocks, ref.heloco_cases)


@pytest.mark.parametrize("off", [dict(heloco_shrink=0.0, heloco_reorient=0.0), dict(heloco_keep=-1.0)])
def test_heloco_without_a_correction_is_the_uncorrected_outer_step(off):
    """Knobs that correct nothing leave every push as it came: the paper's outer Nesterov step (its momentum
    dampened by 1 - mu), written out here, not psrv's plain SGD-Nesterov (torch's, undampened)."""
    o = OptimConfig("sgd", lr=0.05, momentum=0.9, nesterov=True, update_rule="heloco", heloco_block=37, **off)
    s, ref = both(o, pushes(8))
    assert s.rule.blocks == {"kept": 8 * 9, "shrunk": 0, "reoriented": 0}  # 9 blocks a push, none moved
    w, m = randn(1), torch.zeros(SIZE)
    for push in pushes(8):
        m = 0.9 * m + 0.1 * push
        w = w - 0.05 * (push + 0.9 * m)
    assert torch.allclose(s.param.data, w, atol=1e-6, rtol=0)
    corrected = both(OptimConfig("sgd", lr=0.05, momentum=0.9, nesterov=True, update_rule="heloco",
                                 heloco_block=37), pushes(8))[0]
    assert not torch.allclose(corrected.param.data, w, atol=ATOL, rtol=RTOL)  # the test can tell


def test_heloco_by_hand_on_two_elements():
    """m = (0.5, 0) after a first push (1, 0) (mu 0.5); a push (-1, 1) is against it (cos -1/sqrt 2): with k_s 1
    and kappa 1, beta = (1/sqrt 2) sqrt 2 / (sqrt 2 + 0.5) and the push becomes (-1 + beta, 1); a push (1, 1)
    (cos 1/sqrt 2, under keep 0.9) keeps its norm and turns toward (1, 0)."""
    o = OptimConfig("sgd", lr=1.0, momentum=0.5, nesterov=True, update_rule="heloco", heloco_keep=0.9,
                    heloco_shrink=1.0, heloco_reorient=1.0, heloco_kappa=1.0, heloco_block=0)
    s = Shard(2, o)
    s.init(torch.zeros(2))
    s.apply(torch.tensor([1.0, 0.0]), PushContext(0, staleness=0))
    torch.testing.assert_close(s.param.data, torch.tensor([-1.25, 0.0]))
    before = s.param.data.clone()
    s.apply(torch.tensor([-1.0, 1.0]), PushContext(1, staleness=1))
    beta = 1 / (2 ** 0.5 + 0.5)
    d = torch.tensor([-1.0 + beta, 1.0])
    m = 0.5 * torch.tensor([0.5, 0.0]) + 0.5 * d
    torch.testing.assert_close(s.param.data, before - (d + 0.5 * m))
    assert s.rule.blocks == {"kept": 1, "shrunk": 1, "reoriented": 0}
    out = torch.empty(2)
    from psrv.server.rules.heloco import correct
    correct(torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.0]), o, out)
    assert out.norm().item() == pytest.approx(2 ** 0.5) and out[0] > out[1] > 0


def test_heloco_refusals_and_defaults():
    from psrv.config import ConfigError
    o = OptimConfig("sgd", nesterov=True, update_rule="heloco")
    assert (o.heloco_keep, o.heloco_shrink, o.heloco_reorient, o.heloco_kappa, o.heloco_block) == (0.3, 1.0, 0.5,
                                                                                                    1.0, 1 << 20)
    with pytest.raises(ConfigError, match="needs optimizer 'sgd' with nesterov"):
        OptimConfig("sgd", update_rule="heloco")
    with pytest.raises(ConfigError, match="heloco_block: only used by update_rule heloco"):
        OptimConfig("sgd", nesterov=True, update_rule="dn", heloco_block=8)


def test_heloco_state_of_another_size_is_refused_naming_both():
    o = OptimConfig("sgd", lr=0.05, momentum=0.9, nesterov=True, update_rule="heloco")
    s = Shard(SIZE, o)
    with pytest.raises(ValueError, match=r"^rule state momentum has shape \(5,\), this shard 300$"):
        s.rule.load_state_dict({"name": "heloco", "momentum": torch.zeros(5), "kept": 0, "shrunk": 0,
                                "reoriented": 0})


def test_heloco_state_survives_a_checkpoint():
    o = OptimConfig("sgd", lr=0.05, momentum=0.9, nesterov=True, update_rule="heloco", heloco_block=37)
    a = both(o, pushes(6))[0]
    b = Shard(SIZE, o)
    b.load_state_dict(a.state_dict())
    assert b.rule.blocks == a.rule.blocks
    for s in (a, b):
        s.apply(pushes(7)[6], PushContext(0, staleness=1))
    assert torch.equal(a.param.data, b.param.data)


def test_the_plans_heloco_cases_show_the_correction_itself():
    """The rule axis is measured against the other rules (measure.py); heloco's own outer step differs from each
    of them, so that alone would not show the correction. Here every plan case of heloco is run by the reference
    with its knobs and again with strengths 0: the weights differ past the tolerance, and the cases between them
    shrink and turn blocks."""
    triples, pairs, _, _ = load()
    cases = [c for c in triples + pairs if c["rule"] == "heloco"]
    assert cases, "the plan has no heloco case"
    seen = Counter()
    for case in cases:
        cfg = run_config(case)
        with_it = reference_of(cfg, nan=case["nonfinite"] != "none")
        want = with_it.run()
        without = reference_of(cfg, nan=case["nonfinite"] != "none")
        for math in getattr(without, "maths", [without.server]):
            math.o = SimpleNamespace(**{**vars(math.o), "heloco_shrink": 0.0, "heloco_reorient": 0.0})
        other = without.run()
        assert not torch.allclose(want.params, other.params, atol=ATOL, rtol=RTOL), case_id(case)
        for math in getattr(with_it, "maths", [with_it.server]):
            seen.update(math.heloco_cases)
    assert seen["shrunk"] and seen["reoriented"], seen
    assert HELOCO["heloco_keep"] < 1.0


@pytest.mark.parametrize("delta, m, branch", [
    ([1.0, 0.0], [-2.0, 0.0], 1),   # |delta| exactly 1, against m: shrunk (a norm of 1 is not a zero norm)
    ([2.0, 0.0], [-1.0, 0.0], 1),   # |m| exactly 1, against it: shrunk
    ([1.0, 0.0], [0.0, 3.0], 2),    # orthogonal: a cosine of exactly 0 is turned toward m, not kept
])
def test_heloco_at_exact_norms_and_a_cosine_of_zero(delta, m, branch):
    from psrv.server.rules.heloco import correct
    o = OptimConfig("sgd", lr=1.0, momentum=0.5, nesterov=True, update_rule="heloco", heloco_keep=0.5,
                    heloco_shrink=1.0, heloco_reorient=1.0, heloco_kappa=1.0, heloco_block=0)
    out = torch.empty(2)
    counts = correct(torch.tensor(delta), torch.tensor(m), o, out)
    assert counts[branch] == 1 and sum(counts) == 1, counts
    assert not torch.equal(out, torch.tensor(delta))  # the block moved


def test_heloco_at_the_scale_where_its_epsilon_counts():
    """conf's ε (1e-8) is the paper's guard where |Δ_b| + κ|m_b| is near zero; the other cases' pseudo-gradients
    are 1e8 times larger, where ε moves conf by 1e-8 relative. Here every value is about 1e-9 (blocks of 37:
    |Δ_b| near 6e-9, the ε's own size), weights too, and psrv's weights and momentum are held against the
    reference's relatively: an ε of the other sign, or left out, moves them by far more than the tolerance."""
    knobs = dict(KNOBS[1], heloco_kappa=1.0)
    o = OptimConfig("sgd", lr=0.05, momentum=0.9, nesterov=True, update_rule="heloco", **knobs)
    s = Shard(SIZE, o)
    s.init(randn(1) * 1e-9)
    ref = ServerMath(settings(o), randn(1) * 1e-9, workers=2, mode="async")
    for i, push in enumerate(pushes(12)):
        s.apply(push * 1e-9, PushContext(i % 2, staleness=i % 3))
        ref.step(push * 1e-9, worker=i % 2, staleness=i % 3)
    assert min(ref.heloco_cases[k] for k in ("shrunk", "reoriented")) > 0, ref.heloco_cases
    torch.testing.assert_close(s.param.data, ref.w, rtol=1e-4, atol=1e-15)
    torch.testing.assert_close(s.rule.momentum, ref.heloco_m, rtol=1e-4, atol=1e-15)
