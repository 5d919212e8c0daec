"""The Ray parameter-server example, on a psrv job: what a user of Ray would write, timed as psrv is.

python -m psrv.experiments.peers.ray_ps --job digits_mlp --mode async --workers 2 --steps 300
Ray's documented example (docs.ray.io, "Parameter Server", the ray-core examples), in its own shape: one
ParameterServer actor holds the model and an SGD optimizer; its `apply_gradients(*gradients)` adds the
gradients up, steps and returns the weights (a state dict). DataWorker actors take weights, set them, compute
one batch's gradients and return them as numpy arrays. Sync: every worker computes on the same weights and
the server applies all of them at once. Async: the driver waits for any worker's gradients (`ray.wait`),
applies them alone and hands that worker the new weights. What differs from the example, and why: the model,
the data and the batches are the psrv job's (the same a psrv run trains), the optimizer is SGD with the
momentum psrv's bench uses, and sync averages the gradients (the example sums them: the same step at an lr
N times smaller). Throughput counts the training window as psrv's summary does: from the first gradient
asked for to the last weights returned, workers x steps x batch samples.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch


def _weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class ParameterServer:
    def __init__(self, job: str, seed: int, lr: float, momentum: float):
        from psrv.workers.jobs import load_job
        torch.manual_seed(seed)
        self.model = load_job(job, seed=seed).model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=momentum)

    def apply_gradients(self, *gradients):
        mean = [np.stack(per_param).mean(axis=0) for per_param in zip(*gradients)]
        self.optimizer.zero_grad()
        for p, g in zip(self.model.parameters(), mean):
            p.grad = torch.from_numpy(g)
        self.optimizer.step()
        return _weights(self.model)

    def get_weights(self):
        return _weights(self.model)


class DataWorker:
    def __init__(self, job: str, seed: int, rank: int, world_size: int, batch_size: int):
        from psrv.workers.jobs import load_job
        self.job = load_job(job, seed=seed)
        self.model = self.job.model
        self.batches = self.job.batches_for(rank=rank, world_size=world_size, batch_size=batch_size, seed=seed)

    def compute_gradients(self, weights):
        self.model.load_state_dict(weights)
        self.model.zero_grad()
        loss = self.job.loss_of(self.model, next(self.batches))
        loss.backward()
        return [p.grad.numpy() for p in self.model.parameters()]


def run(job: str, mode: str, workers: int, steps: int, batch_size: int = 32, seed: int = 0, lr: float = 0.01,
        momentum: float = 0.9) -> dict:
    import ray
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ps = ray.remote(ParameterServer).remote(job, seed, lr, momentum)
        actors = [ray.remote(DataWorker).remote(job, seed, r, workers, batch_size) for r in range(workers)]
        weights = ps.get_weights.remote()
        ray.get(weights)
        ray.get([a.__ray_ready__.remote() for a in actors])  # every actor built before the clock starts
        started = time.perf_counter()
        if mode == "sync":
            for _ in range(steps):
                weights = ps.apply_gradients.remote(*[a.compute_gradients.remote(weights) for a in actors])
            ray.get(weights)
        else:
            pending = {a.compute_gradients.remote(weights): a for a in actors}
            for _ in range(steps * workers - workers):
                [ready], _ = ray.wait(list(pending))
                actor = pending.pop(ready)
                weights = ps.apply_gradients.remote(ready)
                pending[actor.compute_gradients.remote(weights)] = actor
            ray.get([ps.apply_gradients.remote(ready) for ready in pending])
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
    return {"peer": "ray", "job": job, "mode": mode, "workers": workers, "steps": steps, "batch_size": batch_size,
            "seconds": seconds, "samples_per_second": workers * steps * batch_size / seconds}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="digits_mlp")
    p.add_argument("--mode", choices=("sync", "async"), default="async")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=300, help="per worker")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    result = run(a.job, a.mode, a.workers, a.steps, a.batch_size)
    print(f"ray {a.job} {a.mode}: {result['samples_per_second']:.0f} samples/s")
    if a.out:
        a.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
