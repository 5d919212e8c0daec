"""digits_mlp, the default job: scikit-learn's shipped 8x8 digits (1797 images), a small MLP."""
from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from workers.jobs import Job


def digits_mlp(seed: int) -> Job:
    x, y = load_digits(return_X_y=True)
    # The split is fixed (not seeded) so every run and variant is judged on the same held-out set.
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    as_x = lambda a: torch.tensor(a / 16.0, dtype=torch.float32)  # noqa: E731  (pixels are 0..16)
    as_y = lambda a: torch.tensor(a, dtype=torch.long)  # noqa: E731
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return Job("digits_mlp", model, (as_x(x_tr), as_y(y_tr)), (as_x(x_te), as_y(y_te)))
