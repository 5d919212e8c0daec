"""A general job as a user writes one: a DataLoader over a DistributedSampler shard, dict batches,
loss(model, batch), and evaluate(model) with a regression metric (mse) as its primary metric."""
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from psrv.workers.jobs import Job

FEATURES = 6


class Pairs(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "target": self.y[i]}


def make(seed):
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(FEATURES, 1, generator=gen)
    x, xt = torch.randn(200, FEATURES, generator=gen), torch.randn(64, FEATURES, generator=gen)
    y, yt = x @ w, xt @ w
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def batches(*, rank, world_size, batch_size, seed):
        sampler = DistributedSampler(Pairs(x, y), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        return DataLoader(Pairs(x, y), batch_size=batch_size, sampler=sampler, drop_last=True)

    def loss(model, batch):
        return torch.nn.functional.mse_loss(model(batch["features"]), batch["target"])

    def evaluate(model):
        err = model(xt) - yt
        return {"loss": float((err ** 2).mean()), "mse": float((err ** 2).mean()), "mae": float(err.abs().mean())}

    return Job("regression_loader", model, batches=batches, loss=loss, evaluate=evaluate, metric="mse")
