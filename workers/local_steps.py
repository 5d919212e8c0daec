"""Local SGD and DiLoCo on the worker side: the inner optimizer a worker steps between its pushes
(docs/algorithms.md, "Local SGD and DiLoCo"). The push itself is psrv.Worker's (`local_steps`); the
all-reduce baseline's outer step is workers/ddp.py's `OuterAllReduce`."""
from __future__ import annotations

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
