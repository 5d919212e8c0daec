"""What every all-reduce rank shares, whether the shipped loop's (psrv.workers.allreduce) or psrv.Worker's
under an all-reduce mode (psrv/client/allreduce.py): the device and torch.distributed backend a rank
uses, and the wait for the slowest rank split out of each step's communication time after the run."""
from __future__ import annotations

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")


def init_group(backend: str, **kwargs) -> None:
    """dist.init_process_group(backend, **kwargs), with torch._dynamo and torch.distributed.optim imported
    first. Either, imported after the group (as the first torch.optim optimizer and zero1's
    ZeroRedundancyOptimizer import them), keeps the group alive past destroy_process_group, so gloo's
    threads run on into the interpreter's exit, where one still releasing a finished collective's tensors
    aborts the process ("terminate called without an active exception": a zero1 rank of
    `psrv run --script`, 2 of 15 runs on 2 loaded cores)."""
    import torch._dynamo  # noqa: F401  (their imports are what matters)
    import torch.distributed.optim  # noqa: F401
    dist.init_process_group(backend, **kwargs)


def device_and_backend(name: str, backend: str, local_rank: int, local_world: int) -> tuple[torch.device, str]:
    """The device `name` (cpu, cuda, cuda:N) means for this rank, and the backend: `backend` unless
    'auto', which is gloo on CPU and nccl on CUDA where every local rank has a GPU of its own."""
    if name == "cpu":
        return torch.device("cpu"), "gloo" if backend == "auto" else backend
    count = torch.cuda.device_count()
    if count == 0:
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA device")
    device = torch.device(f"cuda:{local_rank % count}" if name == "cuda" else name)
    if backend != "auto":
        return device, backend
    # nccl refuses two ranks on one GPU; gloo all-reduces CUDA tensors too.
    return device, "nccl" if name == "cuda" and local_world <= count else "gloo"


def split_wait(rows: list[dict], group) -> None:
    """Without a barrier before each collective: every rank (a collective) moves, at each step, its
    communication time beyond the fastest rank's into wait_seconds (workers/allreduce/clock.py says
    why). The rows must be the same steps on every rank."""
    mine = torch.tensor([r["communication_seconds"] for r in rows], dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    fastest = torch.stack(everyone).min(dim=0).values
    for row, least in zip(rows, fastest.tolist()):
        row["wait_seconds"], row["communication_seconds"] = row["communication_seconds"] - least, least
