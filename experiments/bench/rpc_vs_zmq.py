"""rpc_vs_zmq: one PUSH_PULL round trip of the whole model over zmq and over torch RPC, same run.

python -m psrv.experiments.bench.rpc_vs_zmq --sizes-mb 1 16 64 --repeats 7 --out runs/bench/rpc_vs_zmq.json
For each size and transport: one `psrv serve` shard (async, SGD, momentum 0: every push is applied
and the weights come straight back) in a subprocess, and one PSClient in another (RPC allows one
world per process), which times --repeats round trips after --warmup untimed ones. Transports
alternate within each size. Reported: median and min seconds, and (push + pull bytes) / median.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from psrv.process import tune_malloc
from psrv.client.psclient import PSClient
from psrv.partition import ParamSpec, PartitionPlan
from psrv.experiments.launcher.cluster import free_port as _free_port

TRANSPORTS = ("zmq", "rpc")


def _plan(mb: float) -> PartitionPlan:
    return PartitionPlan((ParamSpec("flat", (int(mb * 2**20) // 4,)),), 1)


def client(transport: str, address: str, mb: float, *, warmup: int, repeats: int) -> list[float]:
    """Time `repeats` PUSH_PULL round trips against one shard; returns seconds per round trip."""
    plan = _plan(mb)
    gen = torch.Generator().manual_seed(0)
    flat, grad = torch.randn(plan.total, generator=gen), torch.randn(plan.total, generator=gen)
    times = []
    with PSClient([address], plan, worker=0, world_size=1, transport=transport, timeout=120,
                  shared_memory=False) as c:
        c.hello()
        c.init(flat)
        clock = c.pull(clock=0, out=flat).clock
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            clock = c.push_pull(grad, clock=clock, out=flat).clock
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        c.leave()
    return times


def measure(transport: str, mb: float, *, warmup: int, repeats: int, tmp: Path) -> list[float]:
    """Start a shard and a client process for one (transport, size); return the client's timings."""
    server = [sys.executable, "-m", "psrv.cli", "serve", "--num-shards", "1", "--workers", "1", "--mode", "async",
              "--optimizer", "sgd", "--lr", "1e-6", "--momentum", "0", "--worker-timeout", "120",
              "--transport", transport, "--log-level", "WARNING"]
    if transport == "rpc":
        master = f"127.0.0.1:{_free_port()}"
        server += ["--rpc-master", master]
        address = f"rpc://{master}/server-0"
    else:
        ready = tmp / f"{transport}-{mb}.addr"
        server += ["--bind", "tcp://127.0.0.1:0", "--ready-file", str(ready)]
    procs = [subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        if transport == "zmq":
            deadline = time.monotonic() + 120
            while not ready.exists() and procs[0].poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            address = ready.read_text().strip()
        out = tmp / f"{transport}-{mb}.json"
        me = [sys.executable, "-m", "psrv.experiments.bench.rpc_vs_zmq", "--client", transport, address, "--sizes-mb",
              str(mb), "--warmup", str(warmup), "--repeats", str(repeats), "--out", str(out)]
        procs.append(subprocess.Popen(me, stderr=subprocess.DEVNULL))
        if procs[1].wait(600) != 0 or procs[0].wait(120) != 0:
            raise RuntimeError(f"{transport} {mb} MB: client {procs[1].returncode}, server {procs[0].returncode}")
        return json.loads(out.read_text())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    tune_malloc()  # as psrv's own processes do (psrv/process.py)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64])
    p.add_argument("--repeats", type=int, default=7, help="timed round trips per (size, transport)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the results (JSON) here")
    p.add_argument("--client", nargs=2, metavar=("TRANSPORT", "ADDRESS"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.client:
        times = client(a.client[0], a.client[1], a.sizes_mb[0], warmup=a.warmup, repeats=a.repeats)
        a.out.write_text(json.dumps(times))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in a.sizes_mb:
            for transport in TRANSPORTS:
                times = measure(transport, mb, warmup=a.warmup, repeats=a.repeats, tmp=Path(tmp))
                med = statistics.median(times)
                rows.append({"transport": transport, "mb": mb, "median_s": med, "min_s": min(times),
                             "gb_per_s": 2 * mb * 2**20 / med / 1e9, "times": times})
                print(f"{mb:6g} MB  {transport:3}  median {med * 1e3:8.2f} ms  min {min(times) * 1e3:8.2f} ms  "
                      f"{rows[-1]['gb_per_s']:6.2f} GB/s (push+pull)", flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"repeats": a.repeats, "warmup": a.warmup, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
