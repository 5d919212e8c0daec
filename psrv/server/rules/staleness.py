"""`staleness-lr`: Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD for Distributed Deep Learning"
(IJCAI 2016): a gradient of staleness τ is applied with learning rate lr / τ; a fresh one (τ = 0) as τ = 1."""
from __future__ import annotations

from typing import Callable

import torch

from psrv.server.rules.base import PushContext, UpdateRule, register


@register
class StalenessLR(UpdateRule):
    """g ← g / max(1, τ), before the optimizer step.

    The gradient is scaled, not the step's lr: with SGD momentum the scaled gradient enters the
    momentum buffer, so this gradient's whole contribution (lr/τ · Σ βᵏ over the following steps) is
    divided by τ and the earlier gradients still in the buffer keep their own weights. Scaling the
    step's lr instead would also shrink the older, fresher gradients' share of this step. With
    momentum 0 both are the same update, w ← w − (lr/τ)·g, the paper's. Adam normalises the
    gradient's scale away, so with adam this rule changes little."""

    name = "staleness-lr"

    def prepare(self, grad: torch.Tensor, ctx: PushContext, weights: torch.Tensor,
                out: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
        tau = max(1, ctx.staleness)
        if tau == 1:
            return grad, 1.0
        return torch.div(grad, tau, out=out()), 1.0 / tau
