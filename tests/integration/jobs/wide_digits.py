"""digits_mlp with a 512-wide hidden layer: 154 KB of parameters, so a shard's tensors are big enough
for a payload plane (psrv/transport/plane.py MIN_BYTES) to carry them, where digits_mlp's 38 KB are not."""
import torch

from psrv.workers.jobs import Job
from psrv.workers.jobs.digits import digits_split


def make(seed):
    train, test = digits_split()
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    return Job("wide_digits_mlp", model, train, test)
