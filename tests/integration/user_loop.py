"""A researcher's own training loop on psrv.Worker, run as one process per rank by test_worker_api.py:
RANK, WORLD_SIZE and PSRV_SERVERS come from the environment, as torchrun-style launchers set them.

    python tests/integration/user_loop.py EPOCHS OUT_JSON
"""
import dataclasses
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import psrv

SAMPLES, BATCH, FEATURES = 640, 16, 8   # 320 samples a rank: 20 steps an epoch with 2 workers


def dataset() -> TensorDataset:
    """A seeded synthetic regression: y = tanh(x @ w) + noise."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = torch.tanh(x @ torch.randn(FEATURES, 1, generator=g)) + 0.05 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


class Net(torch.nn.Module):
    """An MLP with what any nn.Module may hold: a parameter that gets no gradient and a buffer."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        self.unused = torch.nn.Parameter(torch.ones(3))
        self.register_buffer("batches_seen", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.batches_seen += 1
        return self.body(x)


def model() -> Net:
    torch.manual_seed(0)
    return Net()


def main(epochs: int, out: str) -> None:
    data, net = dataset(), model()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    ps = psrv.Worker(net)
    losses, infos = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            infos.append(ps.step())
            losses.append(loss.item())
    ps.close()
    with torch.no_grad():
        full = torch.nn.functional.mse_loss(net(data.tensors[0]), data.tensors[1]).item()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    with open(out, "w") as f:
        json.dump({"losses": losses, "infos": [dataclasses.asdict(i) for i in infos], "full_loss": full,
                   "params": flat.tolist(), "batches_seen": int(net.batches_seen)}, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
