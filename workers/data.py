"""Data sharding by rank, exactly as torch's DistributedSampler shards (shuffle, set_epoch)."""
from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data.distributed import DistributedSampler


def batch_indices(n: int, *, rank: int, world_size: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless stream of this rank's batches: DistributedSampler epochs, cut into fixed-size batches.

    Every batch holds exactly batch_size samples (an epoch's tail runs into the next epoch), so
    the global batch of a step is always world_size * batch_size samples.
    """
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    buffer: list[int] = []
    epoch = 0
    while True:
        while len(buffer) < batch_size:
            sampler.set_epoch(epoch)
            buffer.extend(sampler)
            epoch += 1
        yield torch.tensor(buffer[:batch_size])
        buffer = buffer[batch_size:]
