"""The servers' optimizer and learning-rate schedule as torch.optim builds them, for the workers that step
locally: the all-reduce ranks (psrv.workers.allreduce) and psrv.Worker under an all-reduce mode
(psrv/client/allreduce.py)."""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from psrv.config import OptimConfig
from psrv.schedule import is_scheduled, lr_factor


def optimizer_class(cfg: OptimConfig) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """(torch.optim class, its keyword arguments): what psrv.server.optim.flat_optimizer builds."""
    if cfg.name == "sgd":
        return torch.optim.SGD, {"lr": cfg.lr, "momentum": cfg.momentum, "nesterov": cfg.nesterov,
                                 "weight_decay": cfg.weight_decay}
    cls = torch.optim.Adam if cfg.name == "adam" else torch.optim.AdamW
    return cls, {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps, "weight_decay": cfg.weight_decay}


def torch_optimizer(cfg: OptimConfig, params) -> torch.optim.Optimizer:
    """The torch.optim optimizer psrv.server.optim.flat_optimizer builds, over a model's parameters."""
    cls, kwargs = optimizer_class(cfg)
    return cls(params, **kwargs)


def make_schedule(cfg: OptimConfig, optimizer: torch.optim.Optimizer) -> LambdaLR | None:
    """torch's LambdaLR over psrv.schedule.lr_factor, stepped once per optimizer step: the lr the servers
    use at the same update count, bit for bit; None when cfg has no schedule."""
    return LambdaLR(optimizer, functools.partial(lr_factor, cfg)) if is_scheduled(cfg) else None
