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
    """The step indices a worker runs: `steps` of them; under local_steps 'auto:H' (dynamic local
    updates), until it has pushed ceil(steps / H) times, so every worker runs the same number of
    rounds and the fastest takes `steps` inner steps (each round's H_i is never above H)."""
    if not isinstance(cfg.local_steps, str):
        yield from range(steps)
        return
    rounds, step = -(-steps // cfg.local_steps_base), 0
    while len(ps.inner_steps_per_push) < rounds:
        yield step
        step += 1
