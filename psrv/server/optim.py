"""Server-side optimizers: torch.optim itself, stepping one flat parameter vector in place.

Using torch.optim (fused kernels where the device has them) makes the server's step the
same as a worker-side torch.optim step by construction, and allocates nothing per step.
"""
from __future__ import annotations

import torch

from psrv.config import OptimConfig


def make_optimizer(cfg: OptimConfig, param: torch.nn.Parameter, *, fused: bool = True) -> torch.optim.Optimizer:
    """The torch.optim optimizer `cfg` names, over the single flat `param`."""
    extra = {"fused": True} if fused else {}
    if cfg.name == "sgd":
        return torch.optim.SGD([param], lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay, **extra)
    cls = torch.optim.Adam if cfg.name == "adam" else torch.optim.AdamW
    return cls([param], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **extra)
