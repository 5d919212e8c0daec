"""wire: one PUSH_PULL round trip of the whole model against a raw echo of the same bytes.

python -m psrv.experiments.bench.wire --sizes-mb 1 16 64 --shards 1 2 --endpoints tcp ipc --planes zmq bulk
psrv over zmq alone (plane "zmq") is measured against a raw pyzmq echo (baseline "zmq_echo",
experiments/bench/raw_zmq.py), psrv with the bulk plane (plane "bulk", tcp only: psrv/transport/bulk.py)
against a raw TCP socket echo read with recv_into (baseline "socket_echo", experiments/bench/raw_socket.py).
Shared memory is off in every row. Both run side by side and their round trips alternate, so a machine
whose load changes during the run slows both alike; each figure is the median over repeats, and the
ratio is the baseline's median over psrv's.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from psrv.client.psclient import PSClient
from psrv.partition import ParamSpec, PartitionPlan

from psrv.process import tune_malloc
from psrv.experiments.bench.shards import ThreadShard
from psrv.experiments.launcher.cluster import thread_env

BASELINE = {"zmq": "zmq_echo", "bulk": "socket_echo"}


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


def _fresh(tmp: Path, name: str) -> Path:
    ready = tmp / name
    ready.unlink(missing_ok=True)
    return ready


@contextlib.contextmanager
def echo(baseline: str, size: int, kind: str, tmp: Path) -> Iterator[Callable[[], float]]:
    """A raw echo server of `baseline` and a round trip of `size` bytes to it (seconds)."""
    if baseline == "socket_echo":
        from psrv.experiments.bench.raw_socket import EchoClient
        ready = _fresh(tmp, "socket.addr")
        proc, address = _spawn([sys.executable, "-m", "psrv.experiments.bench.raw_socket", "127.0.0.1", str(ready)], ready)
        payload, out = torch.ones(size // 4).numpy(), torch.empty(size // 4).numpy()
        client = EchoClient(address)
        trip = lambda: client.round_trip(payload, out)  # noqa: E731
    else:
        from psrv.experiments.bench.raw_zmq import EchoClient
        ready = _fresh(tmp, "echo.addr")
        proc, address = _spawn([sys.executable, "-m", "psrv.experiments.bench.raw_zmq", _endpoint(kind, tmp, "echo"),
                                str(ready)], ready)
        payload = torch.ones(size // 4).numpy()
        client = EchoClient(address)
        trip = lambda: client.round_trip(payload)  # noqa: E731
    try:
        yield trip
        client.stop()
    finally:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def psrv_shards(size: int, shards: int, kind: str, plane: str, tmp: Path,
                in_thread: bool = False) -> Iterator[Callable[[], float]]:
    """`shards` psrv serve processes (async, SGD) and a PUSH_PULL of `size` bytes to them (seconds);
    with `in_thread` (the smoke's, tcp only), the same shards served from threads of this process."""
    plan = PartitionPlan((ParamSpec("w", (size // 4,)),), shards)
    procs, addresses = [], []
    try:
        for i in range(shards):
            args = ["--shard", str(i), "--num-shards", str(shards), "--workers", "1", "--mode", "async",
                    "--optimizer", "sgd", "--lr", "1e-9", "--momentum", "0.9", "--shared-memory", "off",
                    "--bulk", "auto" if plane == "bulk" else "off"]
            if in_thread and kind == "tcp":
                p = ThreadShard(*args)
                a = p.address
            else:
                ready = _fresh(tmp, f"server-{i}.addr")
                p, a = _spawn([sys.executable, "-m", "psrv.cli", "serve", "--bind", _endpoint(kind, tmp, f"s{i}"),
                               *args, "--log-level", "WARNING", "--ready-file", str(ready)], ready,
                              processes=shards + 1)
            procs.append(p)
            addresses.append(a)
        with PSClient(addresses, plan, worker=0, world_size=1, timeout=120, shared_memory=False,
                      bulk=plane == "bulk") as client:
            client.hello()
            weights, grad = torch.zeros(plan.total), torch.full((plan.total,), 1e-3)
            client.init(weights)
            client.pull(clock=0, out=weights)
            clock = iter(range(10**9))

            def trip() -> float:
                t0 = time.perf_counter()
                client.push_pull(grad, clock=next(clock), out=weights)
                return time.perf_counter() - t0
            yield trip
            client.leave()
    finally:
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def measure(raw_trip: Callable[[], float], size: int, shards: int, kind: str, plane: str, repeats: int,
            tmp: Path, in_thread: bool = False) -> dict:
    """psrv's round trips and its baseline's (`raw_trip`), alternating; the first of each pays for
    first-touch page faults on both sides and is left out."""
    with psrv_shards(size, shards, kind, plane, tmp, in_thread) as psrv_trip:
        raw_trip(), psrv_trip()
        raw, psrv = [], []
        for _ in range(repeats):
            raw.append(raw_trip())
            psrv.append(psrv_trip())
    med, raw_med = statistics.median(psrv), statistics.median(raw)
    return {"bench": "wire", "endpoint": kind, "size_mb": size // 2**20, "shards": shards,
            "plane": plane, "baseline": BASELINE[plane], "psrv_seconds": med, "raw_seconds": raw_med,
            "ratio": raw_med / med, "psrv_spread": [min(psrv), max(psrv)], "raw_spread": [min(raw), max(raw)],
            "repeats": repeats, "psrv_gb_per_s": 2 * size / med / 1e9}


def run(sizes_mb: list[int], shards: list[int], endpoints: list[str], repeats: int,
        planes: tuple[str, ...] = ("zmq",), in_thread: bool = False) -> list[dict]:
    """With `in_thread` (the smoke's), psrv's shards are served from threads of this process."""
    tune_malloc()  # this process is every client: the same allocator for the echoes and for psrv
    results = []
    with tempfile.TemporaryDirectory(prefix="psrv-wire-") as d:
        for kind in endpoints:
            for mb in sizes_mb:
                for plane in planes:
                    if plane == "bulk" and kind != "tcp":
                        continue  # the bulk plane is for remote hosts: tcp only
                    with echo(BASELINE[plane], mb * 2**20, kind, Path(d)) as raw_trip:
                        results += [measure(raw_trip, mb * 2**20, s, kind, plane, repeats, Path(d), in_thread)
                                    for s in shards]
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    p.add_argument("--endpoints", nargs="+", choices=["tcp", "ipc"], default=["tcp"])
    p.add_argument("--planes", nargs="+", choices=["zmq", "bulk"], default=["zmq", "bulk"],
                   help="psrv over zmq alone, and with the bulk plane (tcp only)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    results = run(a.sizes_mb, a.shards, a.endpoints, a.repeats, tuple(a.planes))
    for r in results:
        print(f"{r['endpoint']:>3} {r['size_mb']:>4} MB x{r['shards']} shards over {r['plane']:>4}: psrv "
              f"{r['psrv_seconds']*1e3:7.1f} ms  {r['baseline']:>11} {r['raw_seconds']*1e3:7.1f} ms  "
              f"ratio {r['ratio']:.2f}x")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
