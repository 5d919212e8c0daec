"""The learning-rate schedule, a pure function of the update count: the servers set each step's lr
from their shard's version (psrv/server/shard.py; sync: one update per clock, async and ssp: one per
push, so N workers x S steps in all), and the DDP baseline from its optimizer steps (one per step).

`lr_at(cfg, k)` is the lr of update k (0-based: k updates were applied before it), equal to what
torch.optim.lr_scheduler gives after k `scheduler.step()` calls. With W = warmup_steps,
D = lr_decay_steps, f = lr_end_factor, S = lr_step_size, g = lr_gamma and t = k - W (updates after the
warm-up), lr_at = lr x lr_factor, with lr_factor:

- warm-up (any schedule, k < W): (k + 1) / (W + 1), a straight line from 0 that reaches 1 at k = W;
  torch: LinearLR(start_factor=1/(W+1), end_factor=1, total_iters=W), then the shape below in
  SequentialLR(milestones=[W]) (no SequentialLR when W = 0).
- constant: 1. torch: nothing (or the warm-up's LinearLR alone).
- warmup_cosine: f + (1 - f) (1 + cos(pi t / D)) / 2 for t < D, then f.
  torch: CosineAnnealingLR(T_max=D, eta_min=lr f); torch's curve climbs back up after T_max, psrv
  holds it at lr f.
- linear: 1 - (1 - f) min(t, D) / D. torch: LinearLR(start_factor=1, end_factor=f, total_iters=D).
- step: g ** (t // S). torch: StepLR(step_size=S, gamma=g).
"""
from __future__ import annotations

import math

from psrv.config import OptimConfig


def lr_factor(cfg: OptimConfig, update: int) -> float:
    """lr_at / lr for update `update` (what a torch LambdaLR over this function multiplies lr by)."""
    warmup = cfg.warmup_steps
    if update < warmup:
        return (update + 1) / (warmup + 1)
    t, shape = update - warmup, cfg.lr_schedule
    if shape == "constant":
        return 1.0
    if shape == "step":
        return cfg.lr_gamma ** (t // cfg.lr_step_size)
    end, horizon = cfg.lr_end_factor, cfg.lr_decay_steps
    if t >= horizon:
        return end
    if shape == "linear":
        return 1.0 - (1.0 - end) * t / horizon
    if shape == "warmup_cosine":
        return end + (1.0 - end) * (1.0 + math.cos(math.pi * t / horizon)) / 2
    raise ValueError(f"unknown lr_schedule {shape!r}")


def is_scheduled(cfg: OptimConfig) -> bool:
    """Whether the lr ever differs from cfg.lr (a schedule other than constant, or a warm-up)."""
    return cfg.lr_schedule != "constant" or cfg.warmup_steps > 0


def lr_at(cfg: OptimConfig, update: int) -> float:
    """The learning rate of update `update` (0-based) under cfg's schedule; cfg.lr itself, bit for bit,
    when there is no schedule (constant, no warm-up)."""
    if cfg.lr_schedule == "constant" and update >= cfg.warmup_steps:
        return cfg.lr
    return cfg.lr * lr_factor(cfg, update)
