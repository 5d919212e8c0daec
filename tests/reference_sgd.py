"""The single-process reference the all-reduce worker's tests compare with: torch's SGD over (x, y)
batches with an MSE loss, each step's gradient clipped by global norm and the lr on psrv's linear
warm-up (update k < N: lr*(k+1)/(N+1))."""
from __future__ import annotations

from typing import Iterable

import torch


def clipped_warmup_sgd(net: torch.nn.Module, batches: Iterable, *, lr: float, momentum: float, clip: float,
                       warmup: int) -> tuple[torch.Tensor, int]:
    """The final flat parameters, and the number of steps whose gradient the clip shortened."""
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    clipped = 0
    for k, (x, y) in enumerate(batches):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        clipped += float(torch.nn.utils.clip_grad_norm_(net.parameters(), clip)) > clip
        for group in opt.param_groups:
            group["lr"] = lr * (k + 1) / (warmup + 1) if k < warmup else lr
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]), clipped
