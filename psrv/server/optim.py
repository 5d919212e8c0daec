"""Server-side optimizers: torch.optim itself, stepping one flat parameter vector in place.

Using torch.optim makes the server's step the same as a worker-side torch.optim step by
construction, and allocates nothing per step. Large shards take torch's fused kernels (one pass
over memory: Adam 6.5x faster than the default at 64 MB here); small ones don't, because a fused
step has a fixed cost of about 5 ms on this 2-core machine against 0.2 ms for the plain one (0.1 ms
with foreach=False, which is what a single tensor wants).
"""
from __future__ import annotations

import torch

from psrv.config import OptimConfig


FUSED_MIN_ELEMENTS = 1 << 20


def make_optimizer(cfg: OptimConfig, param: torch.nn.Parameter, *, fused: bool | None = None) -> torch.optim.Optimizer:
    """The torch.optim optimizer `cfg` names, over the single flat `param` (fused: None picks by size)."""
    if fused is None:
        fused = param.numel() >= FUSED_MIN_ELEMENTS
    # One flat tensor: the multi-tensor (foreach) path batches nothing and costs ~0.1 ms a step.
    extra = {"fused": True} if fused else {"foreach": False}
    if cfg.name == "sgd":
        return torch.optim.SGD([param], lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay, **extra)
    cls = torch.optim.Adam if cfg.name == "adam" else torch.optim.AdamW
    return cls([param], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **extra)
