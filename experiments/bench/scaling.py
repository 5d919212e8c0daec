"""scaling: aggregate updates/s of one async shard as concurrent workers grow (1, 4, 16, 32, 64).

python -m psrv.experiments.bench.scaling --workers 1 4 16 32 64 --seconds 3 --repeats 3
Workers are threads, each with its own PSClient, spread over a few load-generator processes so the
clients' GIL is not the bottleneck. The figure is the shard's updates_applied over the measured
window; each count is reported as a ratio to the best count of the same run. The server's CPU
seconds per update, while the load runs, show any per-worker cost growing with N.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from psrv.experiments.bench.loadgen import generate
from psrv.experiments.bench.shards import ThreadShard
from psrv.experiments.launcher.cluster import thread_env


def one(workers: int, seconds: float, size: int, procs: int, tmp: Path, in_thread: bool = False) -> dict:
    """With `in_thread` (the smoke's), the shard is served from a thread of this process, and so is each
    load generator (loadgen.generate, not its process): its CPU seconds are this process's."""
    ready, out = tmp / f"s{workers}.addr", tmp / f"s{workers}.json"
    args = ["--workers", str(workers), "--mode", "async", "--optimizer", "sgd", "--lr", "1e-6", "--momentum", "0",
            "--worker-timeout", "60"]
    if in_thread:
        server = ThreadShard(*args, out=out)
        ready.write_text(server.address)
    else:
        server = subprocess.Popen([sys.executable, "-m", "psrv.cli", "serve", "--bind", "tcp://127.0.0.1:0", *args,
                                   "--log-level", "WARNING", "--ready-file", str(ready), "--out", str(out)],
                                  stdout=subprocess.DEVNULL, env={**os.environ, **thread_env(1 + min(procs, workers))})
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        address = ready.read_text().strip()
        n = min(procs, workers)
        split = [workers // n + (1 if i < workers % n else 0) for i in range(n)]
        firsts = [sum(split[:i]) for i in range(n)]
        cpu0 = _cpu_seconds(server.pid)
        if in_thread:
            with ThreadPoolExecutor(n) as pool:
                reports = list(pool.map(lambda fk: generate(address, fk[0], fk[1], workers, size, seconds),
                                        zip(firsts, split)))
        else:
            gens = [subprocess.Popen([sys.executable, "-m", "psrv.experiments.bench.loadgen", address, str(f),
                                      str(k), str(workers), str(size), str(seconds)], stdout=subprocess.PIPE, text=True)
                    for f, k in zip(firsts, split)]
            reports = [json.loads(g.communicate(timeout=seconds + 120)[0]) for g in gens]
        cpu = _cpu_seconds(server.pid) - cpu0  # the server's CPU while the load ran (and the LEAVEs)
        server.wait(60)
    finally:
        if server.poll() is None:
            server.kill()
    stats = json.loads(out.read_text())
    window = max(r["seconds"] for r in reports)
    acked = sum(r["round_trips"] for r in reports)
    return {"bench": "scaling", "workers": workers, "updates_applied": stats["updates_applied"],
            "acknowledged": acked, "seconds": window, "updates_per_second": stats["updates_applied"] / window,
            "server_cpu_seconds_per_update": cpu / max(1, stats["updates_applied"])}


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(counts: list[int], seconds: float, size: int = 1024, procs: int = 4, repeats: int = 1,
        in_thread: bool = False) -> list[dict]:
    """One row per worker count: the median of `repeats` windows (counts alternate within a repeat),
    as a ratio to the best median of the run. With `in_thread` (the smoke's), each shard and each load
    generator runs in a thread of this process."""
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory(prefix="psrv-scaling-") as d:
        for rep in range(repeats):
            (Path(d) / f"r{rep}").mkdir()
            for n in counts:
                runs[n].append(one(n, seconds, size, procs, Path(d) / f"r{rep}", in_thread))
    rows = []
    for n, rs in runs.items():
        rates = sorted(r["updates_per_second"] for r in rs)
        row = min(rs, key=lambda r: abs(r["updates_per_second"] - statistics.median(rates)))
        rows.append({**row, "updates_per_second": statistics.median(rates), "spread": [rates[0], rates[-1]],
                     "repeats": repeats})
    peak = max(r["updates_per_second"] for r in rows)
    for r in rows:
        r["ratio"] = r["updates_per_second"] / peak
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    rows = run(a.workers, a.seconds, repeats=a.repeats)
    for r in rows:
        print(f"{r['workers']:>3} workers: {r['updates_per_second']:8.0f} updates/s  {r['ratio']:.2f}x peak"
              f"  server CPU {r['server_cpu_seconds_per_update'] * 1e6:4.0f} us/update"
              f"  (acked {r['acknowledged']}, applied {r['updates_applied']})")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
