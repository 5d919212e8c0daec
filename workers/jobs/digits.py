"""digits_mlp, the default job: scikit-learn's shipped 8x8 digits (1797 images), a small MLP; and
digits_cnn, the same images and split as (N, 1, 8, 8) through a small CNN with BatchNorm.

The images are read straight from the CSV that scikit-learn ships (what `load_digits` reads) and
split by the indices in digits_split.json: `train_test_split(test_size=0.2, random_state=0,
stratify=y)` computed once. Importing sklearn costs about 3 s per process, paid by every worker of
every run; tests/unit/test_jobs.py checks that this equals load_digits + train_test_split.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

from psrv.workers.jobs import Job

SPLIT = Path(__file__).with_name("digits_split.json")


def digits_csv() -> Path:
    """sklearn/datasets/data/digits.csv.gz, found without importing sklearn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("digits_mlp needs scikit-learn installed (pip install scikit-learn)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(x, y) exactly as load_digits(return_X_y=True) gives them."""
    with gzip.open(digits_csv(), "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def digits_split() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """((x, y) train, (x, y) test): pixels scaled to 0..1 as (N, 64) float32, labels as int64."""
    x, y = digits_arrays()
    # The split is fixed (not seeded) so every run and variant is judged on the same held-out set.
    split = json.loads(SPLIT.read_text())
    as_x = lambda idx: torch.tensor(x[idx] / 16.0, dtype=torch.float32)  # noqa: E731  (pixels are 0..16)
    as_y = lambda idx: torch.tensor(y[idx], dtype=torch.long)  # noqa: E731
    return (as_x(split["train"]), as_y(split["train"])), (as_x(split["test"]), as_y(split["test"]))


def digits_mlp(seed: int) -> Job:
    train, test = digits_split()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return Job("digits_mlp", model, train, test)


def digits_mlp3(seed: int, *, width: int = 128) -> Job:
    """digits_mlp with three hidden layers of `width` (about 42k parameters): a deeper model for the
    remedies' quality grid (experiments/specs/ef_quality.toml)."""
    train, test = digits_split()
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    return Job("digits_mlp3", model, train, test)


def digits_cnn(seed: int, *, channels: int = 16) -> Job:
    """Two 3x3 conv layers (channels, 2*channels), each with BatchNorm and ReLU, a 2x2 max-pool and a
    linear classifier: about 10k parameters with channels=16, and BatchNorm running statistics."""
    (x, y), (xt, yt) = digits_split()
    c = channels
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, c, 3, padding=1), torch.nn.BatchNorm2d(c), torch.nn.ReLU(),
        torch.nn.Conv2d(c, 2 * c, 3, padding=1), torch.nn.BatchNorm2d(2 * c), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(2 * c * 4 * 4, 10))
    return Job("digits_cnn", model, (x.view(-1, 1, 8, 8), y), (xt.view(-1, 1, 8, 8), yt))
