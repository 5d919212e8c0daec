"""What no case of the matrix reaches in the shard's optimizers (psrv/server/optim.py), found by `make mutants`:
torch's fused kernels, which a shard takes from FUSED_MIN_ELEMENTS elements on (the matrix's job has 120,010, so
never), whole and in chunks; a chunked SGD push without momentum and at momentum 1 (the matrix's SGD is at 0.9);
the two refusals of a step an optimizer cannot take; and a sync clock's mean, which a fused kernel divides in its own
pass (grad_scale). Each against tests/conformance/ref_optim.py."""
import pytest
import torch

from psrv.config import OptimConfig
from psrv.server.optim import flat_optimizer
from psrv.server.rules import PushContext
from psrv.server.shard import Shard
from psrv.server.velocity import Velocity
from tests.conformance.ref_optim import ServerMath, clipped, settings

SIZE = 1000
CHUNKS = ((0, 300), (300, 701), (701, SIZE))
OPTIMIZERS = {"sgd": {"momentum": 0.9}, "nesterov": {"momentum": 0.9, "nesterov": True}, "sgd-m0": {"momentum": 0.0},
              "sgd-m1": {"momentum": 1.0}, "adam": {}, "adamw": {"weight_decay": 0.01}}


def randn(seed: int) -> torch.Tensor:
    return torch.randn(SIZE, generator=torch.Generator().manual_seed(seed))


def config(name: str) -> OptimConfig:
    kind = "sgd" if name.startswith(("sgd", "nesterov")) else name
    return OptimConfig(kind, lr=0.05 if kind == "sgd" else 0.003, **OPTIMIZERS[name])


def run(name: str, *, fused: bool, sliced: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the shard's weights, the reference's) after four pushes, whole or in three chunks each."""
    o = config(name)
    s = Shard(SIZE, o)
    s.optimizer = flat_optimizer(o, s.param, fused=fused)
    s.init(randn(1))
    ref = ServerMath(settings(o), randn(1), workers=1, mode="async")
    for i in range(4):
        g = randn(10 + i)
        if sliced:
            for lo, hi in CHUNKS:
                s.apply_slice(g[lo:hi], lo, hi, PushContext(0))
            s.end_slices()
        else:
            s.apply(g, PushContext(0))
        ref.step(g, worker=0, staleness=0)
    return s.param.data.clone(), ref.w


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("name", ["sgd", "nesterov", "adam", "adamw"])
def test_fused_kernels_match_the_reference(name, sliced):
    got, want = run(name, fused=True, sliced=sliced)
    assert torch.allclose(got, want, atol=1e-6, rtol=0), (got - want).abs().max().item()
    assert not torch.allclose(want, randn(1))


SYNC_VARIANTS = {"plain": {}, "unfused": {}, "clipped": {"clip_grad_norm": 2.0}, "dn": {"update_rule": "dn"},
                 "staleness-lr": {"update_rule": "staleness-lr"}, "velocity": {}}
PUSHES_PER_CLOCK = (2, 3, 2)


def sync_shards(o: OptimConfig, *, fused: bool) -> list[Shard]:
    """Two shards of `o` from the same weights: psrv's, and one made to divide each clock's sum first."""
    shards = []
    for folded in (True, False):
        s = Shard(SIZE, o)
        s.optimizer = flat_optimizer(o, s.param, fused=fused)
        if not folded:
            s._divides_in_step = lambda: False
        s.init(randn(1))
        shards.append(s)
    return shards


def clock_pushes(clock: int) -> list[torch.Tensor]:
    return [randn(50 + 3 * clock + w) * (w + 1) for w in range(PUSHES_PER_CLOCK[clock])]


@pytest.mark.parametrize("name, variant", [(n, v) for v in ("plain", "clipped") for n in ("sgd", "nesterov", "adam", "adamw")]
                         + [("sgd", "unfused"), ("adam", "unfused"), ("nesterov", "dn"), ("sgd", "staleness-lr"),
                            ("sgd", "velocity"), ("nesterov", "velocity")])  # dn: sgd with nesterov
def test_a_sync_mean_divided_in_the_fused_step_matches_the_reference_bit_for_bit_with_dividing_first(name, variant):
    """Clocks of two, three and two pushes: a fused shard under the plain rule divides each clock's sum in the
    optimizer's pass (no pass of its own); unfused (under 1M elements), clipped, under another rule (dn, or
    staleness-lr, which in sync is plain), or a velocity, it divides first, as the mean is read before the step. Its
    weights are the reference's (the mean, clipped where it clips, then the step), bit for bit those of the same
    shard made to divide first, and one update a clock."""
    base = config(name)
    o = OptimConfig(base.name, lr=base.lr, momentum=base.momentum, nesterov=base.nesterov,
                    weight_decay=base.weight_decay, **SYNC_VARIANTS[variant])
    shards = sync_shards(o, fused=variant != "unfused")
    ref = ServerMath(settings(o), randn(1), workers=3, mode="sync")
    for clock in range(len(PUSHES_PER_CLOCK)):
        pushes = clock_pushes(clock)
        for s in shards:
            for g in pushes:
                s.accumulate(Velocity(g) if variant == "velocity" else g)
            assert s.apply_accumulated() == len(pushes)
        mean = torch.stack(pushes).sum(0) / len(pushes)
        ref.step(clipped(mean, o.clip_grad_norm) if o.clip_grad_norm else mean, worker=None, staleness=0,
                 velocity=variant == "velocity")
    folded, divided = (s.param.data for s in shards)
    assert torch.allclose(folded, ref.w, atol=1e-6, rtol=0), (folded - ref.w).abs().max().item()
    assert torch.equal(folded, divided), (folded - divided).abs().max().item()
    assert not torch.allclose(ref.w, randn(1)) and [s.version for s in shards] == [len(PUSHES_PER_CLOCK)] * 2
    assert shards[0].optimizer.divides() == (variant != "unfused")
    assert shards[0]._divides_in_step() == (variant == "plain")


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_an_unfused_optimizer_asked_to_divide_divides_first(name):
    """FlatOptimizer.step(grad, divisor=n) without a fused kernel: grad divided in place, then the step, as
    step(grad / n)."""
    o = config(name)
    mine, theirs = (flat_optimizer(o, randn(1).clone(), fused=False) for _ in range(2))
    for i in range(2):
        g = randn(70 + i)
        sum_ = g * 3
        mine.step(sum_, divisor=3.0)
        theirs.step(g * 3 / 3)
        assert torch.equal(sum_, g * 3 / 3)
    assert not mine.divides() and torch.equal(mine.param, theirs.param)


def test_a_sync_step_asked_with_nothing_accumulated_is_a_bug_said_so():
    s = Shard(SIZE, config("sgd"))
    s.init(randn(1))
    for _ in range(2):  # before any clock, and after one (the sum's buffer is there, holding no sum)
        with pytest.raises(AssertionError, match="^apply_accumulated with nothing accumulated$"):
            s.apply_accumulated()
        s.accumulate(randn(2))
        s.apply_accumulated()


@pytest.mark.parametrize("name", ["adam", "adamw", "adam-wd"])
def test_a_shard_under_the_fused_size_steps_as_torch_optims_single_tensor_kernel_bit_for_bit(name):
    """Below FUSED_MIN_ELEMENTS the shard takes torch.optim's single-tensor step, not the fused kernel, whose Adam
    rounds otherwise (about 3e-8 here); Adam's weight decay is the L2 term, AdamW's the decoupled one."""
    o = OptimConfig("adam", lr=0.003, weight_decay=0.01) if name == "adam-wd" else config(name)
    s = Shard(SIZE, o)
    s.init(randn(1))
    p = torch.nn.Parameter(randn(1).clone())
    kind = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
    theirs = kind([p], lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, foreach=False, fused=False)
    for i in range(4):
        g = randn(60 + i)
        s.apply(g, PushContext(0))
        p.grad = g.clone()
        theirs.step()
    assert not s.optimizer.fused and torch.equal(s.param.data, p.detach()), (s.param.data - p.detach()).abs().max()


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("name", ["sgd-m0", "sgd-m1"])
def test_sgd_without_momentum_or_at_momentum_one_matches_the_reference(name, sliced):
    got, want = run(name, fused=False, sliced=sliced)
    assert torch.allclose(got, want, atol=1e-6, rtol=0), (got - want).abs().max().item()


def test_an_optimizer_refuses_the_step_it_cannot_take():
    adam = flat_optimizer(OptimConfig("adam"), torch.zeros(4), fused=False)
    with pytest.raises(ValueError, match="^a velocity is stepped by sgd only; this shard runs adam$"):
        adam.plain_step(torch.ones(4))
    onebit = flat_optimizer(OptimConfig("onebit_adam", freeze_step=2), torch.zeros(4), fused=False)
    with pytest.raises(ValueError, match="^onebit_adam takes pushes whole$"):
        onebit.step_slice(torch.ones(2), 0, 2)


@pytest.mark.parametrize("name", ["sgd", "nesterov", "adam", "adamw"])
def test_the_state_dict_is_torch_optims_own(name):
    """FlatOptimizer.state_dict promises torch.optim's layout (a checkpoint's `optimizer`, read by anyone's
    torch.optim.load_state_dict): after the same three steps, its group's every key is torch.optim.SGD's, Adam's
    or AdamW's with the same value, and its state is theirs, key for key."""
    o = config(name)
    mine = flat_optimizer(o, torch.nn.Parameter(randn(1).clone(), requires_grad=False), fused=False)
    p = torch.nn.Parameter(randn(1).clone())
    kind = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[o.name]
    args = {"momentum": o.momentum, "nesterov": o.nesterov} if o.name == "sgd" else {"betas": o.betas, "eps": o.eps}
    theirs = kind([p], lr=o.lr, weight_decay=o.weight_decay, **args)
    for i in range(3):
        g = randn(20 + i)
        mine.step(g)
        p.grad = g.clone()
        theirs.step()
    got, want = mine.state_dict(), theirs.state_dict()
    group = want["param_groups"][0]
    assert got["param_groups"][0] and all(group[k] == v for k, v in got["param_groups"][0].items()), \
        (got["param_groups"][0], group)
    assert set(got["param_groups"][0]) >= {"lr", "weight_decay", "params"} | set(args)
    assert set(got["state"]) == set(want["state"]) == {0} and set(got["state"][0]) == set(want["state"][0])
    for key, value in want["state"][0].items():
        assert torch.allclose(got["state"][0][key].float(), value.float(), atol=1e-6), key
    # and torch.optim's own state dict, loaded, goes on as torch.optim does
    again = flat_optimizer(o, torch.nn.Parameter(p.detach().clone(), requires_grad=False), fused=False)
    again.load_state_dict(want)
    g = randn(30)
    again.step(g)
    p.grad = g.clone()
    theirs.step()
    assert torch.allclose(again.param.data, p.detach(), atol=1e-6), (again.param.data - p.detach()).abs().max().item()


@pytest.mark.parametrize("fused", [False, True], ids=["single", "fused"])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_float64_default_dtype_changes_no_bit(name, fused):
    """A host that made float64 torch's default (as test_rule_edges.py checks for the rules): the optimizer's
    state is float32 all the same, Adam's step count too, and the weights after the same pushes are bit for bit."""
    want = run(name, fused=fused, sliced=False)[0]
    init, grads = randn(1), [randn(10 + i) for i in range(4)]  # drawn in float32, as run() draws them
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        s = Shard(SIZE, config(name))
        s.optimizer = flat_optimizer(s.optim_cfg, s.param, fused=fused)
        s.init(init)
        for g in grads:
            s.apply(g, PushContext(0))
    finally:
        torch.set_default_dtype(before)
    kept = {k: v.dtype for k, v in s.optimizer.state.items()}
    assert kept and set(kept.values()) == {torch.float32}, kept
    assert torch.equal(s.param.data, want), (s.param.data - want).abs().max().item()


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_float64_default_dtype_changes_no_bit_of_a_fused_sync_step(name):
    """The same for sync clocks on a fused shard, whose step divides the clock's sum (grad_scale, float32)."""
    runs, init = [], randn(1)
    clocks = [clock_pushes(clock) for clock in range(len(PUSHES_PER_CLOCK))]  # drawn in float32
    for default in (torch.float32, torch.float64):
        before = torch.get_default_dtype()
        torch.set_default_dtype(default)
        try:
            s = Shard(SIZE, config(name))
            s.optimizer = flat_optimizer(s.optim_cfg, s.param, fused=True)
            s.init(init)
            for pushes in clocks:
                for g in pushes:
                    s.accumulate(g)
                s.apply_accumulated()
        finally:
            torch.set_default_dtype(before)
        runs.append(s.param.data)
    assert runs[0].dtype == runs[1].dtype == torch.float32
    assert torch.equal(*runs), (runs[0] - runs[1]).abs().max().item()


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_onebit_adam_takes_the_clocks_word_for_its_freeze(weight_decay):
    """A warm-up clock with no step (every push of it dropped as non-finite) leaves one Adam step where the
    freeze is at two; the next clock's pushes are momenta all the same, as the workers' clocks say: the shard
    takes the frozen step, not another Adam step, as tests/conformance/ref_optim.py's 1-bit Adam does."""
    o = OptimConfig("onebit_adam", lr=0.003, freeze_step=2, weight_decay=weight_decay)
    s = Shard(SIZE, o)
    s.init(randn(1))
    ref = ServerMath(settings(o), randn(1), workers=1, mode="sync")
    for i, momenta in enumerate((False, True, True)):  # clock 0, then clocks 2 and 3 (clock 1 had no step)
        push = randn(40 + i)
        s.accumulate(push, momentum=momenta)
        s.apply_accumulated()
        ref.step(push, worker=None, staleness=0, momentum_push=momenta)
    assert torch.allclose(s.param.data, ref.w, atol=1e-6, rtol=0), (s.param.data - ref.w).abs().max().item()
