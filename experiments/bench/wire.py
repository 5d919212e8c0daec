"""wire: one PUSH_PULL round trip of the whole model against a raw pyzmq echo of the same bytes.

python -m experiments.bench.wire --sizes-mb 1 16 64 --shards 1 2 --endpoints tcp ipc
Each psrv figure is the median over repeats, divided by the raw echo's median from the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from psrv.client import PSClient
from psrv.partition import ParamSpec, PartitionPlan

from psrv.process import tune_malloc
from experiments.cluster import thread_env


def _spawn(argv: list[str], ready: Path, timeout: float = 60.0, processes: int = 2) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **thread_env(processes)})
    deadline = time.monotonic() + timeout
    while not ready.exists() or not ready.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{argv[2:4]} did not start")
        time.sleep(0.02)
    return proc, ready.read_text().strip()


def _endpoint(kind: str, tmp: Path, name: str) -> str:
    return f"ipc://{tmp}/{name}.sock" if kind == "ipc" else "tcp://127.0.0.1:0"


def raw_echo(size: int, kind: str, repeats: int, tmp: Path) -> list[float]:
    from experiments.bench.raw_zmq import EchoClient
    ready = tmp / "echo.addr"
    ready.unlink(missing_ok=True)
    proc, address = _spawn([sys.executable, "-m", "experiments.bench.raw_zmq", _endpoint(kind, tmp, "echo"),
                            str(ready)], ready)
    try:
        client = EchoClient(address)
        payload = torch.ones(size // 4).numpy()
        client.round_trip(payload)  # warm-up
        times = [client.round_trip(payload) for _ in range(repeats)]
        client.stop()
    finally:
        proc.wait(10)
    return times


def psrv_push_pull(size: int, shards: int, kind: str, repeats: int, tmp: Path) -> list[float]:
    plan = PartitionPlan((ParamSpec("w", (size // 4,)),), shards)
    procs, addresses = [], []
    for i in range(shards):
        ready = tmp / f"server-{i}.addr"
        ready.unlink(missing_ok=True)
        p, a = _spawn([sys.executable, "-m", "psrv.cli", "serve", "--bind", _endpoint(kind, tmp, f"s{i}"),
                       "--shard", str(i), "--num-shards", str(shards), "--workers", "1", "--mode", "async",
                       "--optimizer", "sgd", "--lr", "1e-9", "--momentum", "0.9", "--log-level", "WARNING",
                       "--ready-file", str(ready)], ready, processes=shards + 1)
        procs.append(p)
        addresses.append(a)
    try:
        with PSClient(addresses, plan, worker=0, world_size=1, timeout=120) as client:
            client.hello()
            weights, grad = torch.zeros(plan.total), torch.full((plan.total,), 1e-3)
            client.init(weights)
            client.pull(clock=0, out=weights)
            times = []
            for step in range(repeats + 1):
                t0 = time.perf_counter()
                client.push_pull(grad, clock=step, out=weights)
                times.append(time.perf_counter() - t0)
            client.leave()
    finally:
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    return times[1:]  # the first round trip pays for first-touch page faults on both sides


def run(sizes_mb: list[int], shards: list[int], endpoints: list[str], repeats: int) -> list[dict]:
    tune_malloc()  # this process is both clients: the same allocator for the echo and for psrv
    results = []
    with tempfile.TemporaryDirectory(prefix="psrv-wire-") as d:
        tmp = Path(d)
        for kind in endpoints:
            for mb in sizes_mb:
                size = mb * 2**20
                raw = statistics.median(raw_echo(size, kind, repeats, tmp))
                for s in shards:
                    times = psrv_push_pull(size, s, kind, repeats, tmp)
                    med = statistics.median(times)
                    results.append({"bench": "wire", "endpoint": kind, "size_mb": mb, "shards": s,
                                    "psrv_seconds": med, "raw_seconds": raw, "ratio": raw / med,
                                    "psrv_spread": [min(times), max(times)], "repeats": repeats,
                                    "psrv_gb_per_s": 2 * size / med / 1e9})
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    p.add_argument("--endpoints", nargs="+", choices=["tcp", "ipc"], default=["tcp"])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    results = run(a.sizes_mb, a.shards, a.endpoints, a.repeats)
    for r in results:
        print(f"{r['endpoint']:>3} {r['size_mb']:>4} MB x{r['shards']} shards: psrv {r['psrv_seconds']*1e3:7.1f} ms"
              f"  raw echo {r['raw_seconds']*1e3:7.1f} ms  ratio {r['ratio']:.2f}x raw")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
