"""checkpoint_latency: push latency of an Adam shard while its checkpoints are written, against without.

python -m psrv.experiments.bench.checkpoint_latency --size-mb 256 --seconds 30
One `psrv serve` process per variant (async, adam, 2 workers): "off" has no checkpoints; "on" takes
one every --every seconds, so with a shard this big a write is nearly always in flight (the row
reports how many were written and how long each took). Two threads of this process push a gradient
of the shard's size in turn, each with its own PSClient; every push's round trip is timed. The ratio
is p99(on) / p99(off). Before checkpoints left the event loop, a push that arrived during a write
waited for all of it: `checkpoint_seconds` is that wait. With `in_thread` (the test's,
tests/integration/test_checkpoint_bench.py) each shard is served from a thread of this process instead.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from psrv.experiments.bench.shards import ThreadShard
from psrv.partition import ParamSpec, PartitionPlan
from psrv.client.psclient import PSClient

WORKERS = 2


def pusher(address: str, rank: int, size: int, seconds: float, latencies: list[float], hello: threading.Barrier):
    """Push as worker `rank` for `seconds` from the moment both workers have said HELLO (INIT is rank 0's)."""
    plan = PartitionPlan((ParamSpec("w", (size,)),), 1)
    grad = torch.full((size,), 1e-6)
    with PSClient([address], plan, worker=rank, world_size=WORKERS, timeout=120, shared_memory=False) as c:
        c.hello()
        if rank == 0:
            c.init(torch.zeros(size))
        hello.wait(120)
        c.pull(clock=0, out=torch.empty(size))
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            started = time.perf_counter()
            c.push(grad, clock=0)
            latencies.append(time.perf_counter() - started)
        c.leave()


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) >= 2 else values[0]


def measure(tmp: Path, variant: str, size: int, seconds: float, every: float, in_thread: bool = False) -> dict:
    """Serve one shard (checkpoints `variant` "on" or "off"), push from two threads for `seconds`. With
    `in_thread`, the shard is served from a thread of this process (its pushes then share this process's
    cores and GIL: for a test that the bench runs, not for its figures)."""
    ready, out = tmp / f"{variant}.addr", tmp / f"{variant}.json"
    ckpt = ["--checkpoint-dir", str(tmp / variant), "--checkpoint-every", str(every)] if variant == "on" else []
    options = ["--workers", str(WORKERS), "--mode", "async", "--optimizer", "adam", "--lr", "1e-3", *ckpt]
    if in_thread:
        server = ThreadShard(*options, out=out)
        ready.write_text(server.address)
    else:
        server = subprocess.Popen([sys.executable, "-P", "-m", "psrv.cli", "serve", "--bind", "tcp://127.0.0.1:0",
                                   *options, "--log-level", "WARNING", "--ready-file", str(ready), "--out", str(out)])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"psrv serve ({variant}) did not start")
            time.sleep(0.05)
        address = ready.read_text().strip()
        latencies: list[list[float]] = [[] for _ in range(WORKERS)]
        hello = threading.Barrier(WORKERS)
        threads = [threading.Thread(target=pusher, args=(address, r, size, seconds, latencies[r], hello))
                   for r in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        server.wait(300)
        summary = json.loads(out.read_text())
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    pushes = sorted(x for lat in latencies for x in lat[1:])  # each thread's first push warms its buffers
    return {"pushes": len(pushes), "p50": statistics.median(pushes), "p99": p99(pushes), "max": pushes[-1],
            "checkpoints": summary.get("checkpoints", 0), "checkpoint_seconds": summary.get("checkpoint_seconds")}


def run(size_mb: int = 256, seconds: float = 30.0, every: float = 0.5, in_thread: bool = False) -> list[dict]:
    size = size_mb * (1 << 20) // 4
    with tempfile.TemporaryDirectory(prefix="psrv-ckpt-bench-") as tmp:
        off = measure(Path(tmp), "off", size, seconds, every, in_thread)
        on = measure(Path(tmp), "on", size, seconds, every, in_thread)
    return [{"bench": "checkpoint_latency", "size_mb": size_mb, "optimizer": "adam", "workers": WORKERS,
             "every": every, "p99_off": off["p99"], "p99_on": on["p99"], "ratio": on["p99"] / off["p99"],
             "off": off, "on": on}]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256, help="the shard's parameters, MB (Adam keeps 3x that)")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds of pushes per variant")
    p.add_argument("--every", type=float, default=0.5, help="--checkpoint-every of the 'on' variant")
    p.add_argument("--out", type=Path, help="also write the row here (JSON)")
    a = p.parse_args(argv)
    if a.size_mb < 1 or a.seconds <= 0 or a.every <= 0:
        p.error("--size-mb, --seconds and --every must be positive")
    rows = run(a.size_mb, a.seconds, a.every)
    text = json.dumps(rows, indent=1)
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
