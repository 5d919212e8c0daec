"""mnist1d_mlp: MNIST-1D generated offline by the mnist1d package (4000 train, 1000 test), a deeper MLP."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from workers.jobs import Job


def _dataset() -> dict:
    """make_dataset with the package's default arguments, cached (generation takes seconds)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "psrv" / "mnist1d-default.npz"
    if cache.exists():
        return dict(np.load(cache))
    from mnist1d.data import get_dataset_args, make_dataset  # never get_dataset: it goes to the network
    d = make_dataset(get_dataset_args())
    data = {k: np.asarray(d[k]) for k in ("x", "y", "x_test", "y_test")}
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **data)
    os.replace(tmp, cache)
    return data


def mnist1d_mlp(seed: int) -> Job:
    d = _dataset()
    x, xt = (torch.tensor(d[k], dtype=torch.float32) for k in ("x", "x_test"))
    y, yt = (torch.tensor(d[k], dtype=torch.long) for k in ("y", "y_test"))
    mean, std = x.mean(0), x.std(0) + 1e-6
    width = 256
    model = torch.nn.Sequential(
        torch.nn.Linear(40, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    return Job("mnist1d_mlp", model, ((x - mean) / std, y), ((xt - mean) / std, yt))
