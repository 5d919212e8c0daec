"""A hierarchy of servers (HALoS's shape) as one process: regions, each with a local model and its own
optimizer, syncing with one global model, written from the rule (docs/algorithms.md "A hierarchy of servers"),
never from psrv's code.

A region's turn: K steps of its optimizer on the gradients its worker computes at the region's weights; then a
sync: delta = anchor - w (the change since the region last took the global weights), the global model takes
one SGD step on delta (torch.optim.SGD's documented heavy ball: b = delta at the first step, else mu b + delta;
g <- g - lr b), and the region's weights become g plus its updates since it sent (none here: a turn waits for
its sync), anchor <- g. The regions' optimizers are torch.optim's own (their state lives across syncs).
"""
from __future__ import annotations

from typing import Callable

import torch


def run(initial: torch.Tensor, gradient: Callable[[int, torch.Tensor], torch.Tensor], turns: list[int], *, every: int,
        local: Callable[[torch.nn.Parameter], torch.optim.Optimizer], global_lr: float,
        global_momentum: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the global weights, each region's) after `turns` (a region per turn, `every` steps each); `gradient(r, w)`
    is region r's worker's gradient at w; `local(param)` makes a region's optimizer."""
    regions = max(turns) + 1
    g = initial.clone()
    buf: torch.Tensor | None = None
    params = [torch.nn.Parameter(initial.clone()) for _ in range(regions)]
    opts = [local(p) for p in params]
    anchors = [initial.clone() for _ in range(regions)]
    for r in turns:
        p = params[r]
        for _ in range(every):
            p.grad = gradient(r, p.detach().clone())
            opts[r].step()
        delta = anchors[r] - p.detach()
        buf = delta.clone() if buf is None else buf.mul(global_momentum).add(delta)
        g = g - global_lr * buf
        with torch.no_grad():
            p.copy_(g)
        anchors[r] = g.clone()
    return g, [p.detach().clone() for p in params]
