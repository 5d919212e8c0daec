"""The conformance matrix's job: a small MLP on a fixed random teacher, big enough that every shard of
three, and every chunk of a push (axes.CHUNK_MB), carries a tensor frame over 64 KiB (so the payload
planes carry it), with --compress-min-numel 1024 leaving its biases dense beside the codec, and one
input always 0 (as digits' blank pixels), so the weights it feeds never get a gradient (onebit_adam's
v stays 0 there).

`tiny` trains cleanly; `tiny_nan` gives worker 1 a NaN loss (so NaN everywhere in its gradient) at
its step NAN_STEP: the same injection in-process and under `psrv run`, where the job runs in the
worker's own process. Each batch carries (rank, step), so the loss knows where it is."""
from __future__ import annotations

import torch

from psrv.workers.jobs import Job

FEATURES, HIDDEN, CLASSES, SAMPLES = 64, 1600, 10, 512
NAN_RANK, NAN_STEP = 1, 2


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    x[:, 0] = 0.0
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    return x, (x @ teacher).argmax(1)


def model(seed: int) -> torch.nn.Module:
    # the CPU generator alone, as torch.manual_seed seeds it: that one also queues a seed for each lazy device
    # (CUDA, XPU, MTIA) with the stack formatted for each, 2.4 ms a call, 9 s of the matrix's CPU
    torch.random.default_generator.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def batches(*, rank: int, world_size: int, batch_size: int, seed: int):
    """Endless: rank's own fixed-size batches, each with its (rank, step) tag."""
    x, y = _data(seed)
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    step = 0
    while True:
        for idx in torch.randperm(SAMPLES, generator=gen).split(batch_size):
            if len(idx) == batch_size:
                yield x[idx], y[idx], torch.tensor([rank, step])
                step += 1


def loss(m: torch.nn.Module, batch, *, nan: bool = False) -> torch.Tensor:
    x, y, tag = batch
    value = torch.nn.functional.cross_entropy(m(x), y)
    if nan and tuple(tag.tolist()) == (NAN_RANK, NAN_STEP):
        value = value * float("nan")
    return value


def evaluate(m: torch.nn.Module, seed: int) -> dict[str, float]:
    x, y = _data(seed + 1)
    out = m(x)
    return {"loss": float(torch.nn.functional.cross_entropy(out, y)), "accuracy": float((out.argmax(1) == y).float().mean())}


def _job(seed: int, nan: bool) -> Job:
    return Job(name="tiny_nan" if nan else "tiny", model=model(seed), batches=batches,
               loss=lambda m, b: loss(m, b, nan=nan), evaluate=lambda m: evaluate(m, seed))


def tiny(seed: int) -> Job:
    return _job(seed, nan=False)


def tiny_nan(seed: int) -> Job:
    return _job(seed, nan=True)
