"""colocated: a PUSH_PULL round trip through the shared-memory plane against memcpy of the same bytes.

python -m psrv.experiments.bench.colocated --sizes-mb 16 64 --repeats 9
A worker and one shard on this host, as `psrv run` starts them: the shard reads the push in place and
the worker copies the weights out of the shard's memory, straight into its own (psrv/transport/shm.py).
The round trip includes the shard's SGD step (lr 1e-9, no momentum: one multiply-add over the model;
experiments/bench/apply.py measures optimizers against memcpy on their own). Two pushes: from a
gradient in shared memory, as psrv.Worker keeps its flat gradient ("shared", no copy), and from a
tensor of the caller's own ("own", one copy into the worker's push slot). "in place": from the shared gradient,
and the weights read where they lie in the shard's memory (pull_in_place, psrv/client/in_place.py: no copy either
way; `pulls_in_place` counts the answers read so, and a row whose pulls fell back to copies says 0).

Baseline, in the same process and interleaved with the round trips: torch's copy of the same bytes
between two fp32 buffers. A PUSH_PULL moves the model both ways, so its bandwidth is 2 x size / time,
and the ratio is that over memcpy's size / time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from psrv.experiments.bench.shards import ThreadShard
from psrv.experiments.bench.wire import _spawn
from psrv.client.psclient import PSClient
from psrv.partition import ParamSpec, PartitionPlan
from psrv.process import tune_malloc


def _serve(tmp: Path, in_thread: bool = False) -> tuple:
    args = ["--workers", "1", "--mode", "async", "--optimizer", "sgd", "--lr", "1e-9", "--momentum", "0",
            "--shared-memory", "auto"]
    if in_thread:
        shard = ThreadShard(*args)
        return shard, shard.address
    ready = tmp / "server.addr"
    ready.unlink(missing_ok=True)
    return _spawn([sys.executable, "-m", "psrv.cli", "serve", "--bind", "tcp://127.0.0.1:0", *args,
                   "--log-level", "WARNING", "--ready-file", str(ready)], ready)


def measure(size: int, push: str, repeats: int, tmp: Path, in_thread: bool = False) -> dict:
    plan = PartitionPlan((ParamSpec("w", (size // 4,)),), 1)
    proc, address = _serve(tmp, in_thread)
    try:
        with PSClient([address], plan, worker=0, world_size=1, timeout=120, shared_memory=True,
                      pull_in_place=push == "in place") as client:
            client.hello()
            weights = torch.zeros(plan.total)
            grad = torch.full((plan.total,), 1e-3)
            if push in ("shared", "in place"):
                grad = client.share(grad)
            client.init(weights)
            client.pull(clock=0, out=weights)
            src, dst = torch.ones(plan.total), torch.empty(plan.total)
            trips, copies = [], []
            for step in range(repeats + 1):
                t0 = time.perf_counter()
                client.push_pull(grad, clock=step, out=weights)
                t1 = time.perf_counter()
                dst.copy_(src)
                t2 = time.perf_counter()
                trips.append(t1 - t0)
                copies.append(t2 - t1)
            plane = type(client.net._plane[0]).__name__ if client.net._plane[0] is not None else "none"
            in_place = client.in_place.read
            if push == "in place" and in_place < repeats + 2:  # the first pull and every round trip
                raise RuntimeError(f"{in_place} of {repeats + 2} pulls were read in place: the row would time copies")
            client.leave()
    finally:
        proc.wait(20)
    trip, copy = statistics.median(trips[1:]), statistics.median(copies[1:])  # the first pays page faults
    return {"bench": "colocated", "size_mb": size >> 20, "shards": 1, "push": push, "plane": plane,
            "optimizer": "sgd (no momentum)", "psrv_seconds": trip, "memcpy_seconds": copy,
            "psrv_gb_per_s": 2 * size / trip / 1e9, "memcpy_gb_per_s": size / copy / 1e9,
            "ratio": 2 * copy / trip, "psrv_spread": [min(trips[1:]), max(trips[1:])], "repeats": repeats,
            "pulls_in_place": in_place}


def run(sizes_mb: list[int], repeats: int, pushes: tuple[str, ...] = ("shared", "own", "in place"),
        in_thread: bool = False) -> list[dict]:
    """With `in_thread` (the smoke's), the shard is served from a thread of this process."""
    tune_malloc()
    with tempfile.TemporaryDirectory(prefix="psrv-colocated-") as d:
        return [measure(mb << 20, push, repeats, Path(d), in_thread) for mb in sizes_mb for push in pushes]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[16, 64])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    results = run(a.sizes_mb, a.repeats)
    for r in results:
        print(f"{r['size_mb']:>4} MB push from {r['push']:>8} ({r['plane']}): {r['psrv_seconds'] * 1e3:7.1f} ms "
              f"= {r['psrv_gb_per_s']:.2f} GB/s  memcpy {r['memcpy_gb_per_s']:.2f} GB/s  ratio {r['ratio']:.2f}x")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
