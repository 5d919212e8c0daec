"""`cgad`: Cosine-Gated Adam-Decay (Shah and Sun, "Cosine-Gated Adam-Decay: Drop-In Staleness-Aware Outer
Optimization for Decoupled DiLoCo", arXiv 2605.09126, 2026): a push (a pseudo-gradient with local steps) of
age τ is scaled by σ(τ) = γ(τ) e^(-ατ) before it enters the optimizer, Adam's first and second moments in the
paper. The exponential models information decay; the cosine gate γ zeroes contributions at and past a cutoff.

The paper's abstract defines σ and says γ is a cosine gate that "smoothly zeroes contributions past a chosen
cutoff"; its text was not available to us. psrv's gate is the half cosine from 1 at τ = 0 to 0 at τ = τc,
γ(τ) = (1 + cos(π τ / τc)) / 2 for τ < τc, else 0 (τc = 0: no gate, the paper's "Adam-Decay" baseline).
Like the paper's, σ(0) = 1: a fresh push is plain Adam's, bit for bit. With SGD the rule scales the step as
staleness-lr does, by σ(τ) in place of 1/τ."""
from __future__ import annotations

import math
from typing import Callable

import torch

from psrv.server.rules.base import PushContext, UpdateRule, register


def cgad_scale(tau: int, alpha: float, cutoff: int) -> float:
    """σ(τ) = γ(τ) e^(-ατ), γ the half cosine to 0 at `cutoff` (0: no gate)."""
    if cutoff and tau >= cutoff:
        return 0.0
    gate = (1.0 + math.cos(math.pi * tau / cutoff)) / 2 if cutoff else 1.0
    return gate * math.exp(-alpha * tau)


@register
class CGAD(UpdateRule):
    """g ← σ(τ) g, before the optimizer step (τ the push's staleness: updates since its worker's pull)."""

    name = "cgad"

    def prepare(self, grad: torch.Tensor, ctx: PushContext, weights: torch.Tensor,
                out: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
        scale = cgad_scale(ctx.staleness, self.cfg.cgad_alpha, self.cfg.cgad_cutoff)
        if scale == 1.0:
            return grad, 1.0
        return torch.mul(grad, scale, out=out()), scale
