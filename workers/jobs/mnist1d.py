"""MNIST-1D generated offline by the mnist1d package (4000 train, 1000 test, 40 points a sample):
mnist1d_mlp, a deeper MLP; mnist1d_cnn, the same data as (N, 1, 40) through a small 1-D CNN."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from psrv.workers.jobs import Job
from psrv.atomic import replacing


def _dataset() -> dict:
    """make_dataset with the package's default arguments, cached (generation takes seconds)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "psrv" / "mnist1d-default.npz"
    if cache.exists():
        return dict(np.load(cache))
    from mnist1d.data import get_dataset_args, make_dataset  # never get_dataset: it goes to the network
    d = make_dataset(get_dataset_args())
    data = {k: np.asarray(d[k]) for k in ("x", "y", "x_test", "y_test")}
    with replacing(cache, "wb") as f:
        np.savez(f, **data)
    return data


def mnist1d_split() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """((x, y) train, (x, y) test): x (N, 40) float32 standardised per position by the train split."""
    d = _dataset()
    x, xt = (torch.tensor(d[k], dtype=torch.float32) for k in ("x", "x_test"))
    y, yt = (torch.tensor(d[k], dtype=torch.long) for k in ("y", "y_test"))
    mean, std = x.mean(0), x.std(0) + 1e-6
    return ((x - mean) / std, y), ((xt - mean) / std, yt)


def mnist1d_mlp(seed: int) -> Job:
    train, test = mnist1d_split()
    width = 256
    model = torch.nn.Sequential(
        torch.nn.Linear(40, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    return Job("mnist1d_mlp", model, train, test)


def mnist1d_cnn(seed: int, *, channels: int = 32) -> Job:
    """Three 1-D conv layers (kernel 5; the last two stride 2: 40 -> 20 -> 10 points) with ReLU and a
    linear classifier: about 14k parameters with channels=32."""
    (x, y), (xt, yt) = mnist1d_split()
    c = channels
    model = torch.nn.Sequential(
        torch.nn.Conv1d(1, c, 5, padding=2), torch.nn.ReLU(),
        torch.nn.Conv1d(c, c, 5, stride=2, padding=2), torch.nn.ReLU(),
        torch.nn.Conv1d(c, c, 5, stride=2, padding=2), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(c * 10, 10))
    return Job("mnist1d_cnn", model, (x.unsqueeze(1), y), (xt.unsqueeze(1), yt))
