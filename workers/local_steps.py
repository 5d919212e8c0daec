"""Local SGD and DiLoCo on the worker side: the inner optimizer a worker steps between its pushes
(docs/algorithms.md, "Local SGD and DiLoCo"). The push itself is psrv.Worker's (`local_steps`); the
all-reduce baseline's outer step is workers/allreduce/local.py's `OuterAllReduce`."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from psrv.config import WorkerSettings


def make_inner_optimizer(cfg: WorkerSettings, params) -> torch.optim.Optimizer:
    """cfg.inner_optimizer at cfg.inner_lr over `params`: torch.optim.SGD (no momentum) or
    torch.optim.AdamW (torch's defaults otherwise: betas 0.9/0.999, eps 1e-8, weight decay 0.01)."""
    if cfg.inner_optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.inner_lr)
    if cfg.inner_optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.inner_lr)
    raise ValueError(f"no inner optimizer to make (inner_optimizer is {cfg.inner_optimizer!r})")


def inner_steps(cfg: WorkerSettings, steps: int, ps) -> Iterator[int]:
    """The step indices a worker runs: from `ps.start_step` (0, or the run's step at the clock a restarted or
    late worker joined at) to `steps`, so every worker ends with the run; under local_steps 'auto:H' (dynamic
    local updates), until the run has pushed ceil(steps / H) rounds (this worker's from `ps.start_clock`), so
    every worker ends at the same round and the fastest takes `steps` inner steps (each round's H_i <= H)."""
    if not isinstance(cfg.local_steps, str):
        yield from range(ps.start_step, steps)
        return
    rounds, step = -(-steps // cfg.local_steps_base) - ps.start_clock, ps.start_step
    while len(ps.inner_steps_per_push) < rounds:
        yield step
        step += 1
