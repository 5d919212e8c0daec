"""synthetic_mlp: an MLP of about 10M parameters on seeded random data, where communication dominates."""
from __future__ import annotations

import torch

from psrv.workers.jobs import Job


def synthetic_mlp(seed: int, *, features: int = 1024, hidden: int = 4096, classes: int = 10) -> Job:
    gen = torch.Generator().manual_seed(1234)  # the data is the same for every seed
    teacher = torch.randn(features, classes, generator=gen)
    x = torch.randn(4096, features, generator=gen)
    xt = torch.randn(512, features, generator=gen)
    model = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden // 4), torch.nn.ReLU(),
                                torch.nn.Linear(hidden // 4, classes))
    return Job("synthetic_mlp", model, (x, (x @ teacher).argmax(1)), (xt, (xt @ teacher).argmax(1)))
