"""The learning-rate schedule: the lr a shard uses at each update is torch.optim.lr_scheduler's for the
same schedule (the real scheduler classes driving a torch.optim.SGD); a served shard applies it by its
update count; the DDP baseline follows it by its optimizer steps."""
from __future__ import annotations

import math

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR, StepLR

from psrv.client.psclient import PSClient
from psrv.config import ConfigError, JobConfig, OptimConfig, RunConfig, ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.schedule import is_scheduled, lr_at
from psrv.server.optim import FUSED_MIN_ELEMENTS, flat_optimizer
from psrv.server.run import Server
from psrv.server.shard import Shard
from tests.helpers import in_spawned_process
from psrv.workers.data import batch_indices
from psrv.workers.allreduce.loop import train_allreduce
from psrv.workers.jobs import load_job

pytestmark = pytest.mark.timeout(120)
UPDATES, LR = 50, 0.1


def torch_scheduler(cfg: OptimConfig, opt: torch.optim.Optimizer):
    """cfg's schedule built from torch's own classes, as psrv/schedule.py's docstring says it is."""
    warmup, f = cfg.warmup_steps, cfg.lr_end_factor
    shape = {"constant": lambda: None,
             "warmup_cosine": lambda: CosineAnnealingLR(opt, T_max=cfg.lr_decay_steps, eta_min=cfg.lr * f),
             "linear": lambda: LinearLR(opt, start_factor=1.0, end_factor=f, total_iters=cfg.lr_decay_steps),
             "step": lambda: StepLR(opt, step_size=cfg.lr_step_size, gamma=cfg.lr_gamma)}[cfg.lr_schedule]
    if not warmup:
        return shape()
    warm = LinearLR(opt, start_factor=1 / (warmup + 1), end_factor=1.0, total_iters=warmup)
    rest = shape()
    return warm if rest is None else SequentialLR(opt, [warm, rest], milestones=[warmup])


def _case(shape: str, warmup: int, **settings) -> OptimConfig:
    return OptimConfig(lr=LR, momentum=0.9, lr_schedule=shape, warmup_steps=warmup, **settings)


# each shape with and without warm-up; cosine's horizon ends at update UPDATES (past T_max torch's
# curve climbs back up, psrv's holds: tested below), linear's at 30 (both hold after it)
CASES = [_case("constant", 6)] + [case for w in (0, 6) for case in (
    _case("warmup_cosine", w, lr_decay_steps=UPDATES - w),
    _case("warmup_cosine", w, lr_decay_steps=UPDATES - w, lr_end_factor=0.1),
    _case("linear", w, lr_decay_steps=30),
    _case("linear", w, lr_decay_steps=30, lr_end_factor=0.2),
    _case("step", w, lr_step_size=7, lr_gamma=0.5))]


@pytest.mark.parametrize("cfg", CASES, ids=lambda c: f"{c.lr_schedule}-w{c.warmup_steps}-f{c.lr_end_factor}")
def test_the_shards_lr_at_each_update_is_torch_lr_schedulers(cfg):
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(64, generator=gen)
    shard = Shard(init.numel(), cfg)
    shard.init(init)
    ref = torch.nn.Parameter(init.clone())
    opt = torch.optim.SGD([ref], lr=cfg.lr, momentum=cfg.momentum)
    scheduler = torch_scheduler(cfg, opt)
    ours, theirs = [], []
    for _ in range(UPDATES):
        grad = torch.randn(64, generator=gen)
        theirs.append(opt.param_groups[0]["lr"])
        ref.grad = grad.clone()
        opt.step()
        scheduler.step()
        shard.apply(grad)
        ours.append(shard.optimizer.lr)  # the lr the shard's step just took
    assert shard.version == UPDATES
    assert len(set(theirs)) > 5                                    # the schedule really moves the lr
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= 1e-12, list(zip(ours, theirs))
    torch.testing.assert_close(shard.weights, ref.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_a_large_shards_fused_adam_takes_the_scheduled_lr(name):
    cfg = OptimConfig(name, lr=1e-2, weight_decay=1e-2, warmup_steps=2, lr_schedule="warmup_cosine", lr_decay_steps=6)
    gen = torch.Generator().manual_seed(3)
    init = torch.randn(FUSED_MIN_ELEMENTS, generator=gen)
    shard = Shard(init.numel(), cfg)
    shard.init(init)
    assert shard.optimizer.fused
    ref = torch.nn.Parameter(init.clone())
    opt = (torch.optim.Adam if name == "adam" else torch.optim.AdamW)([ref], lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch_scheduler(cfg, opt)
    for _ in range(8):
        grad = torch.randn(init.numel(), generator=gen)
        ref.grad = grad.clone()
        opt.step()
        scheduler.step()
        shard.apply(grad)
    torch.testing.assert_close(shard.weights, ref.detach(), rtol=1e-6, atol=1e-6)


def test_warm_up_climbs_from_zero_and_decay_holds_its_end_past_the_horizon():
    cfg = OptimConfig(lr=LR, warmup_steps=4, lr_schedule="warmup_cosine", lr_decay_steps=10, lr_end_factor=0.25)
    assert [lr_at(cfg, k) / LR for k in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lr_at(cfg, 9) == pytest.approx(LR * (0.25 + 0.75 * (1 + math.cos(math.pi / 2)) / 2))
    assert [lr_at(cfg, k) for k in (14, 15, 100)] == [LR * 0.25] * 3


def test_no_schedule_is_the_plain_lr_bit_for_bit():
    cfg = OptimConfig(lr=LR, momentum=0.9)
    assert not is_scheduled(cfg) and is_scheduled(cfg.replace(warmup_steps=1))
    assert all(lr_at(cfg, k) == LR for k in range(1000))
    gen = torch.Generator().manual_seed(1)
    init, grads = torch.randn(32, generator=gen), [torch.randn(32, generator=gen) for _ in range(20)]
    shard = Shard(32, cfg)
    shard.init(init)
    plain = init.clone()
    optimizer = flat_optimizer(cfg, plain)  # the server's optimizer alone, its lr never touched
    for grad in grads:
        shard.apply(grad)
        optimizer.step(grad)
    assert torch.equal(shard.weights, plain)


@pytest.mark.parametrize(("settings", "key"), [
    (dict(lr_schedule="warmup_cosine"), "lr_decay_steps"),
    (dict(lr_schedule="linear"), "lr_decay_steps"),
    (dict(lr_schedule="step"), "lr_step_size"),
    (dict(lr_decay_steps=10), "lr_decay_steps"),
    (dict(lr_end_factor=0.5), "lr_end_factor"),
    (dict(lr_gamma=0.5), "lr_gamma"),
    (dict(lr_schedule="step", lr_step_size=5, lr_decay_steps=10), "lr_decay_steps"),
    (dict(lr_schedule="linear", lr_decay_steps=10, lr_step_size=5), "lr_step_size"),
    (dict(lr_schedule="linear", lr_decay_steps=10, lr_end_factor=1.5), "lr_end_factor"),
])
def test_settings_a_schedule_does_not_use_or_lacks_are_errors(settings, key):
    with pytest.raises(ConfigError) as err:
        OptimConfig(**settings)
    assert err.value.key == key


def test_a_served_sync_shard_applies_the_schedule_by_its_update_count():
    cfg = OptimConfig(lr=LR, momentum=0.0, warmup_steps=3, lr_schedule="warmup_cosine", lr_decay_steps=6,
                      lr_end_factor=0.1)
    server_cfg = ServerConfig(workers=1, mode="sync", bind="tcp://127.0.0.1:0", worker_timeout=30.0, optimizer=cfg)
    plan = PartitionPlan((ParamSpec("w", (4,)),), 1)
    grad = torch.tensor([1.0, -2.0, 0.5, 3.0])
    flat = torch.tensor([0.5, 0.25, -1.0, 2.0])
    seen = []
    with Server(server_cfg).start() as server, \
            PSClient([server.address], plan, worker=0, world_size=1, timeout=20) as client:
        client.hello()
        client.init(flat)
        clock = client.pull(clock=0, out=flat).clock
        for _ in range(12):                 # past the horizon (update 9), where the lr holds
            before = flat.clone()
            clock = client.push_pull(grad, clock=clock, out=flat).clock
            seen.append(flat - before)
        client.leave()
    for k, step in enumerate(seen):         # update k moved the weights by -lr_at(k) x gradient
        torch.testing.assert_close(step, -lr_at(cfg, k) * grad, rtol=0, atol=1e-6, msg=f"update {k}")
    assert len({round(lr_at(cfg, k), 9) for k in range(12)}) >= 8


def _torch_loop(cfg: RunConfig, *, scheduled: bool) -> torch.Tensor:
    """One process, plain torch: the job, rank 0's batches, torch.optim.SGD and torch's schedulers."""
    job = load_job(cfg.job.name, seed=cfg.seed)
    x, y = job.train
    opt = torch.optim.SGD(job.model.parameters(), lr=cfg.optimizer.lr, momentum=cfg.optimizer.momentum)
    scheduler = torch_scheduler(cfg.optimizer, opt) if scheduled else None
    batches = batch_indices(len(x), rank=0, world_size=1, batch_size=cfg.job.batch_size, seed=cfg.seed)
    for _ in range(cfg.job.steps):
        idx = next(batches)
        opt.zero_grad()
        job.loss_fn(job.model(x[idx]), y[idx]).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return torch.cat([p.detach().reshape(-1) for p in job.model.parameters()])


def test_ddp_follows_the_schedule_by_its_optimizer_steps(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    optim = OptimConfig(lr=0.2, momentum=0.5, warmup_steps=5, lr_schedule="step", lr_step_size=4, lr_gamma=0.3)
    cfg = RunConfig(mode="ddp", job=JobConfig(steps=20, batch_size=32), optimizer=optim)
    got = in_spawned_process(train_allreduce, cfg)["final_params"]  # gloo in a child of its own
    want, unscheduled = _torch_loop(cfg, scheduled=True), _torch_loop(cfg, scheduled=False)
    assert (want - unscheduled).abs().max() > 1e-2       # the schedule makes a difference here
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_a_restored_shard_goes_on_with_the_schedule_from_its_version():
    cfg = OptimConfig(lr=LR, momentum=0.9, warmup_steps=3, lr_schedule="linear", lr_decay_steps=12)
    gen = torch.Generator().manual_seed(2)
    init, grads = torch.randn(16, generator=gen), [torch.randn(16, generator=gen) for _ in range(20)]
    straight, first = Shard(16, cfg), Shard(16, cfg)
    for shard in (straight, first):
        shard.init(init)
    for grad in grads[:10]:
        straight.apply(grad)
        first.apply(grad)
    restored = Shard(16, cfg)
    restored.load_state_dict({k: v.clone() if torch.is_tensor(v) else v for k, v in first.state_dict().items()})
    for grad in grads[10:]:
        straight.apply(grad)
        restored.apply(grad)
    assert restored.optimizer.lr == lr_at(cfg, 19) != lr_at(cfg, 9)
    assert torch.equal(restored.weights, straight.weights)
