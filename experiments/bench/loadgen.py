"""A load generator process: THREADS workers, each with its own PSClient, push_pull for SECONDS.

python -m psrv.experiments.bench.loadgen ADDRESS FIRST_RANK THREADS WORLD SIZE SECONDS
Prints one JSON line: {"round_trips": ..., "seconds": ...}. Used by experiments.bench.scaling (whose
smoke calls generate() in a thread instead of starting this process).
"""
from __future__ import annotations

import json
import sys
import threading
import time

import torch

from psrv.process import tune_malloc
from psrv.client.psclient import PSClient
from psrv.partition import ParamSpec, PartitionPlan


def worker(address: str, rank: int, world: int, size: int, until: float, counts: list[int], slot: int) -> None:
    plan = PartitionPlan((ParamSpec("w", (size,)),), 1)
    weights, grad = torch.zeros(size), torch.full((size,), 1e-6)
    with PSClient([address], plan, worker=rank, world_size=world, timeout=60, shared_memory=False) as c:
        c.hello()
        if rank == 0:
            c.init(weights)
        reply = c.pull(clock=0, out=weights)
        clock = reply.clock
        while time.monotonic() < until:
            clock = c.push_pull(grad, clock=clock, out=weights).clock
            counts[slot] += 1
        c.leave()


def main() -> None:
    tune_malloc()  # as psrv's own processes do (psrv/process.py)
    address, first, threads, world, size, seconds = sys.argv[1], *map(int, sys.argv[2:6]), float(sys.argv[6])
    print(json.dumps(generate(address, first, threads, world, size, seconds)))


def generate(address: str, first: int, threads: int, world: int, size: int, seconds: float) -> dict:
    """Ranks first..first+threads-1 of `world`, each a thread with its own PSClient, push_pull for
    `seconds`: {"round_trips": ..., "seconds": ...}. The process's body, and the smoke's load generator
    in a thread of the bench's process."""
    counts = [0] * threads
    until = time.monotonic() + seconds
    t0 = time.monotonic()
    ts = [threading.Thread(target=worker, args=(address, first + i, world, size, until, counts, i))
          for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"round_trips": sum(counts), "seconds": time.monotonic() - t0}


if __name__ == "__main__":
    main()
