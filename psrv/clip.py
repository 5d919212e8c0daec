"""Gradient clipping by global norm over one flat gradient, as torch.nn.utils.clip_grad_norm_ does it."""
from __future__ import annotations

import torch


def clip_flat_(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale `grad` in place by min(1, max_norm / (norm + 1e-6)), torch's clip_grad_norm_ formula, with
    no host sync; returns the L2 norm before clipping (a 0-dim tensor on grad's device)."""
    norm = torch.linalg.vector_norm(grad, 2.0)
    grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm
