"""memory: peak RSS of a server and of a worker, each against what its job needs at the least.

python -m psrv.experiments.bench.memory --size-mb 256 --worker-job synthetic_mlp
Server: a 256 MB model with Adam. It reports its own peak RSS (getrusage) in its --out JSON; the
baseline is 3 x the model (parameters + Adam's two moments) plus the peak RSS of a process that only
imports torch, measured in the same run. Goal: <= 1.2x.
Worker: a real `psrv worker` training the job for a few steps, against a process that trains the same
job with plain torch (same batches, its own .grad tensors, evaluation at start and end) and no
parameter server. The figure is the difference in model-sized buffers. Goal: <= 2 (one flat gradient
and one flat parameter buffer at most beyond the model). Each side is the median of 3 runs: one peak RSS
moves by 16-50 MiB from run to run (the allocator's arenas), more than one model size of synthetic_mlp
(32 MiB), and single runs gave 1.5 to 3.3 model sizes for the same code.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from psrv.experiments.bench.shards import ThreadShard
from psrv.process import tune_malloc
from psrv.client.psclient import PSClient
from psrv.partition import ParamSpec, PartitionPlan

BARE = "import torch; from psrv.rss import peak_rss_bytes; print(peak_rss_bytes())"
PLAIN = "from psrv.experiments.bench.memory import plain_training as p; print(p({job!r}, {steps}))"


def bare_torch_rss() -> int:
    return int(subprocess.run([sys.executable, "-c", BARE], capture_output=True, text=True, check=True).stdout)


def plain_training(job_name: str, steps: int) -> int:
    """Train `job_name` in this process with plain torch and no server; return the peak RSS."""
    from psrv.rss import peak_rss_bytes
    from psrv.workers.data import batch_indices
    from psrv.workers.jobs import evaluate, load_job
    job = load_job(job_name, seed=0)
    x, y = job.train
    batches = batch_indices(len(x), rank=0, world_size=1, batch_size=32, seed=0)
    params = list(job.model.parameters())
    evaluate(job, job.model)
    for _ in range(steps):
        idx = next(batches)
        job.loss_fn(job.model(x[idx]), y[idx]).backward()
        with torch.no_grad():  # SGD in place, as a psrv worker holds no optimizer either (nor torch.optim's imports)
            for p in params:
                p.add_(p.grad, alpha=-1e-3)
                p.grad.zero_()
    evaluate(job, job.model)
    return peak_rss_bytes()


def _start_server(tmp: Path, optimizer: str, *, wait: bool = True) -> tuple[subprocess.Popen, str, Path]:
    """A one-worker async shard; its address, or "@READY_FILE" when not waiting for it."""
    ready, out = tmp / f"{optimizer}.addr", tmp / f"{optimizer}.json"
    server = subprocess.Popen([sys.executable, "-m", "psrv.cli", "serve", "--bind", "tcp://127.0.0.1:0",
                               "--workers", "1", "--mode", "async", "--optimizer", optimizer, "--lr", "1e-4",
                               "--log-level", "WARNING", "--ready-file", str(ready), "--out", str(out)],
                              stdout=subprocess.DEVNULL)
    if not wait:
        return server, f"@{ready}", out
    deadline = time.monotonic() + 120
    while not ready.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    return server, ready.read_text().strip(), out


def worker_rss(job: str, steps: int, tmp: Path, in_thread: bool = False) -> int:
    """The peak RSS of a `psrv worker` training `job`; its shard is a process, or with `in_thread` (the
    smoke's) served from a thread of this process (only the worker's RSS is measured)."""
    if in_thread:
        server = ThreadShard("--workers", "1", "--mode", "async", "--optimizer", "sgd", "--lr", "1e-4")
        address = server.address
    else:
        server, address, _ = _start_server(tmp, "sgd", wait=False)
    out = tmp / "worker.json"
    try:
        subprocess.run([sys.executable, "-m", "psrv.cli", "worker", "--servers", address, "--job", job,
                        "--steps", str(steps), "--batch-size", "32", "--log-level", "WARNING", "--out", str(out)],
                       check=True, timeout=300, stdout=subprocess.DEVNULL)
        server.wait(60)
    finally:
        if server.poll() is None:
            server.kill()
    return json.loads(out.read_text())["max_rss_bytes"]


def server_rss(size_mb: int, tmp: Path) -> int:
    server, address, out = _start_server(tmp, "adam")
    try:
        plan = PartitionPlan((ParamSpec("w", (size_mb * 2**20 // 4,)),), 1)
        weights = torch.zeros(plan.total)
        with PSClient([address], plan, worker=0, world_size=1, timeout=300, shared_memory=False) as c:
            c.hello()
            c.init(weights)
            clock = c.pull(clock=0, out=weights).clock
            grad = torch.full((plan.total,), 1e-3)
            for _ in range(3):
                clock = c.push_pull(grad, clock=clock, out=weights).clock
            c.leave()
        server.wait(60)
    finally:
        if server.poll() is None:
            server.kill()
    return json.loads(out.read_text())["max_rss_bytes"]


def plain_rss(job: str, steps: int) -> int:
    return int(subprocess.run([sys.executable, "-c", PLAIN.format(job=job, steps=steps)],
                              capture_output=True, text=True, check=True).stdout)


def run(size_mb: int, worker_job: str = "synthetic_mlp", worker_steps: int = 5, repeats: int = 3,
        in_thread: bool = False) -> list[dict]:
    """With `in_thread` (the smoke's), the worker's shard is served from a thread of this process; the
    server row's shard is a process, whose own peak RSS is the figure."""
    # Separate processes, each measuring its own peak: they may run side by side.
    with tempfile.TemporaryDirectory(prefix="psrv-mem-") as d, ThreadPoolExecutor(4) as pool:
        bare = pool.submit(bare_torch_rss)
        peak = pool.submit(server_rss, size_mb, Path(d))
        workers, plains = [], []
        for r in range(repeats):
            (Path(d) / str(r)).mkdir()
            worker = pool.submit(worker_rss, worker_job, worker_steps, Path(d) / str(r), in_thread)
            plain = pool.submit(plain_rss, worker_job, worker_steps)
            workers.append(worker.result())
            plains.append(plain.result())
        bare, peak = bare.result(), peak.result()
    worker, plain = statistics.median(workers), statistics.median(plains)
    model = size_mb * 2**20
    baseline = 3 * model + bare
    from psrv.workers.jobs import load_job
    model_bytes = sum(p.numel() * p.element_size() for p in load_job(worker_job, seed=0).model.parameters())
    return [{"bench": "memory", "role": "server", "size_mb": size_mb, "optimizer": "adam", "peak_rss_bytes": peak,
             "bare_torch_bytes": bare, "baseline_bytes": baseline, "ratio": peak / baseline},
            {"bench": "memory", "role": "worker", "job": worker_job, "model_bytes": model_bytes,
             "peak_rss_bytes": worker, "baseline_bytes": plain, "ratio": (worker - plain) / model_bytes,
             "repeats": repeats, "peak_rss_each": workers, "baseline_each": plains}]


def main(argv: list[str] | None = None) -> None:
    tune_malloc()  # as psrv's own processes do (psrv/process.py)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256, help="server model size (default: %(default)s)")
    p.add_argument("--worker-job", default="synthetic_mlp", help="the worker's job (default: %(default)s)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    rows = run(a.size_mb, a.worker_job)
    server, worker = rows
    print(f"server {server['size_mb']} MB adam: peak RSS {server['peak_rss_bytes']/2**20:.0f} MiB, baseline "
          f"{server['baseline_bytes']/2**20:.0f} MiB (3x model + bare torch), {server['ratio']:.2f}x")
    print(f"worker {worker['job']}: peak RSS {worker['peak_rss_bytes']/2**20:.0f} MiB vs plain torch "
          f"{worker['baseline_bytes']/2**20:.0f} MiB: {worker['ratio']:.2f} model-sized buffers more")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
