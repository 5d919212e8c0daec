"""A model whose parameters and gradients are views into two flat buffers.

Pulled weights are copied straight into the model (or, under pull_in_place, the model views them where they
lie: point), and the gradient is pushed from one flat buffer with no concatenation. A `.grad` that a user's
`model.zero_grad()` set to None is re-attached by a post-accumulate-grad hook as soon as backward produces it
(one copy), so the flat gradient is always the one backward computed.
"""
from __future__ import annotations

import torch


class FlatModel:
    """`params` and `grads`: fp32 buffers in `model.parameters()` order (the partition plan's order).
    Raises ValueError, naming the parameter, for a model with no parameters, a parameter that is not
    float32, or parameters on more than one device. `grads=False` places no flat gradient yet: the
    caller places one (place_grads) before backward."""

    def __init__(self, model: torch.nn.Module, *, grads: bool = True):
        self.model = model
        named = list(model.named_parameters())
        if not named:
            raise ValueError(f"{type(model).__name__} has no parameters to train")
        device = named[0][1].device
        for name, p in named:
            if p.dtype != torch.float32:
                raise ValueError(f"parameter {name!r} is {str(p.dtype).removeprefix('torch.')}; psrv keeps "
                                 "parameters as float32: call model.float() first")
            if p.device != device:
                raise ValueError(f"parameter {name!r} is on {p.device}, the first one on {device}: "
                                 "put the whole model on one device")
        total = sum(p.numel() for _, p in named)
        self._params = [p for _, p in named]
        self.params = torch.empty(total, dtype=torch.float32, device=device)
        offset = 0
        for i, p in enumerate(self._params):
            n = p.numel()
            self.params[offset:offset + n].copy_(p.data.view(-1))
            p.data = self.params[offset:offset + n].view_as(p)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda q, i=i: self._keep(q, self._views[i]))
            offset += n
        self.own = self.params  # the model's own buffer; `params` may be another's (point)
        self._views: list[torch.Tensor] = []
        if grads:
            self.place_grads(torch.zeros(total, dtype=torch.float32, device=device))

    def point(self, weights: torch.Tensor) -> None:
        """Make `weights` (the flat size: the model's own buffer, or a shard's weights read in place) what every
        parameter views, where it does not already."""
        if weights.data_ptr() == self.params.data_ptr():
            return
        offset = 0
        for p in self._params:
            p.data = weights[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.params = weights

    def keep_own(self) -> None:
        """Copy the weights the model views into its own buffer and view that (before what it viewed goes)."""
        if self.params.data_ptr() != self.own.data_ptr():
            self.own.copy_(self.params)
            self.point(self.own)

    def place_grads(self, buffer: torch.Tensor) -> None:
        """Make `buffer` (zeros, the flat size; e.g. in memory a transport sends from without a copy) the
        flat gradient that every parameter's .grad views."""
        self.grads = buffer
        self._views, offset = [], 0
        for p in self._params:
            view = buffer[offset:offset + p.numel()].view_as(p)
            p.grad = view  # backward accumulates in place
            self._views.append(view)
            offset += p.numel()

    def zero_grad(self) -> None:
        self.grads.zero_()

    @staticmethod
    def _keep(p: torch.Tensor, view: torch.Tensor) -> None:
        """After p's gradient is accumulated: if it landed outside the flat buffer (its .grad had been
        set to None or replaced), copy it in and make the view p's .grad again."""
        if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
            p.grad = view
