"""A model whose parameters and gradients are views into two flat buffers.

Pulled weights are copied straight into the model, and the gradient is pushed from one flat
buffer with no concatenation.
"""
from __future__ import annotations

import torch


class FlatModel:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        params = list(model.parameters())
        device = params[0].device
        total = sum(p.numel() for p in params)
        self.params = torch.empty(total, dtype=torch.float32, device=device)
        self.grads = torch.zeros(total, dtype=torch.float32, device=device)
        offset = 0
        for p in params:
            n = p.numel()
            self.params[offset:offset + n].copy_(p.data.view(-1))
            p.data = self.params[offset:offset + n].view_as(p)
            p.grad = self.grads[offset:offset + n].view_as(p)  # backward accumulates in place
            offset += n

    def zero_grad(self) -> None:
        self.grads.zero_()
