"""The pytorch/examples RPC parameter server, on a psrv job: what a user of torch RPC would write, timed as
psrv is.

python -m psrv.experiments.peers.rpc_ps --job digits_mlp --workers 1 --steps 300
pytorch/examples' distributed/rpc/parameter_server, in its own shape: rank 0 is the parameter server and
holds the model; each trainer's forward is an rpc_sync to it (the model runs there), its backward a
dist_autograd.backward through that call, and its step a DistributedOptimizer's SGD on the server's
parameters. It runs one trainer: with two or more, a trainer's optimizer step changes the server's parameters
while another's backward still needs them, and dist_autograd fails ("modified by an inplace operation";
pytorch/examples issue 780, open), so the bench compares it with psrv on one worker. What differs from the example,
and why: the model, the data and the batches are the psrv job's; SGD has the momentum psrv's bench uses
(DistributedOptimizer keeps one optimizer per trainer on the server, so each trainer has its own momentum,
as in the example); the example's per-step check that the server holds gradients (one more RPC) is left
out, being verification rather than training; TensorPipe's transports are torch's defaults, as a user of the
example has them. Throughput counts the training window as psrv's summary does: from the first trainer's
first step to the last trainer's last, workers x steps x batch samples.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer

_server = None
_lock = threading.Lock()


class ParameterServer(torch.nn.Module):
    def __init__(self, job: str, seed: int):
        super().__init__()
        from psrv.workers.jobs import load_job
        torch.manual_seed(seed)
        self.model = load_job(job, seed=seed).model

    def forward(self, x):
        return self.model(x)

    def param_rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]


def _get_server(job: str, seed: int) -> ParameterServer:
    global _server
    with _lock:  # one model, however many trainers ask first
        if _server is None:
            _server = ParameterServer(job, seed)
        return _server


def _call(method, rref, *args):
    return method(rref.local_value(), *args)


def _remote(method, rref, *args):
    return rpc.rpc_sync(rref.owner(), _call, args=(method, rref, *args))


def _member(rank: int, world: int, port: int, job: str, steps: int, batch_size: int, seed: int, lr: float,
            momentum: float, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # each process its share, as psrv run gives
    name = "parameter_server" if rank == 0 else f"trainer_{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world)
    if rank:
        from psrv.workers.jobs import load_job
        the_job = load_job(job, seed=seed)
        batches = the_job.batches_for(rank=rank - 1, world_size=world - 1, batch_size=batch_size, seed=seed)
        server = rpc.remote("parameter_server", _get_server, args=(job, seed))
        opt = DistributedOptimizer(torch.optim.SGD, _remote(ParameterServer.param_rrefs, server), lr=lr,
                                   momentum=momentum)
        first = next(batches)
        started = time.monotonic()
        for i in range(steps):
            x, y = first if i == 0 else next(batches)
            with dist_autograd.context() as cid:
                loss = the_job.loss_fn(_remote(ParameterServer.forward, server, x), y)
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
        Path(out, f"trainer-{rank}.json").write_text(json.dumps([started, time.monotonic()]))
    rpc.shutdown()


def run(job: str, workers: int, steps: int, batch_size: int = 32, seed: int = 0, lr: float = 0.01,
        momentum: float = 0.9) -> dict:
    from psrv.experiments.launcher.cluster import free_port
    with tempfile.TemporaryDirectory(prefix="psrv-rpc-ps-") as out:
        mp.spawn(_member, args=(workers + 1, free_port(), job, steps, batch_size, seed, lr, momentum, out),
                 nprocs=workers + 1, join=True)
        spans = [json.loads(Path(out, f"trainer-{r}.json").read_text()) for r in range(1, workers + 1)]
    seconds = max(e for _, e in spans) - min(s for s, _ in spans)
    return {"peer": "torch_rpc_example", "job": job, "mode": "async", "workers": workers, "steps": steps,
            "batch_size": batch_size, "seconds": seconds, "samples_per_second": workers * steps * batch_size / seconds}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="digits_mlp")
    p.add_argument("--workers", type=int, default=1, help="trainers (more than 1 fails, as in the example)")
    p.add_argument("--steps", type=int, default=300, help="per trainer")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    result = run(a.job, a.workers, a.steps, a.batch_size)
    print(f"pytorch/examples rpc ps {a.job}: {result['samples_per_second']:.0f} samples/s")
    if a.out:
        a.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
