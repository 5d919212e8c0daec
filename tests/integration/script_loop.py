"""user_loop.py's data and model in a loop for `psrv run --script` (test_run_script.py): it hands its
loss and batch size to step(), stops after PSRV_STEPS steps when psrv run passes --steps, and rank 0
saves its final weights.

    python tests/integration/script_loop.py EPOCHS OUT [FAIL_AT]

OUT: rank 0's final flat parameters (torch.save); each rank's losses go to OUT.losses-RANK.json.
FAIL_AT: rank 1 raises before that step (a script that fails).
"""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, DistributedSampler

import psrv
from user_loop import BATCH, dataset, model  # python puts this script's folder on sys.path


def main(epochs: int, out: str, fail_at: int | None = None) -> None:
    data, net = dataset(), model()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    steps = int(os.environ.get("PSRV_STEPS", 10**9))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    losses = []
    with psrv.make_worker(net) as ps:
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                if ps.steps == steps:
                    break
                if rank == 1 and ps.steps == fail_at:
                    raise RuntimeError(f"rank 1 fails at step {fail_at}, as asked")
                loss = torch.nn.functional.mse_loss(net(x), y)
                loss.backward()
                ps.step(loss=loss, batch_size=len(x))
                losses.append(loss.item())
    with open(f"{out}.losses-{rank}.json", "w") as f:
        json.dump(losses, f)
    if rank == 0:
        torch.save(torch.cat([p.detach().reshape(-1) for p in net.parameters()]), out)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
