"""The default job's data is scikit-learn's digits with train_test_split's split, read without sklearn."""
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from workers.jobs import load_job
from workers.jobs.digits import digits_arrays


def test_digits_are_load_digits_and_the_split_is_train_test_split():
    x, y = load_digits(return_X_y=True)
    gx, gy = digits_arrays()
    np.testing.assert_array_equal(gx, x)
    np.testing.assert_array_equal(gy, y)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    job = load_job("digits_mlp", seed=0)
    for got, want in ((job.train[0], x_tr), (job.test[0], x_te)):
        torch.testing.assert_close(got, torch.tensor(want / 16.0, dtype=torch.float32), rtol=0, atol=0)
    for got, want in ((job.train[1], y_tr), (job.test[1], y_te)):
        assert torch.equal(got, torch.tensor(want, dtype=torch.long))
