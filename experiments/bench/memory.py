"""memory: peak RSS of a server holding a large model with Adam, against 3x the model + bare torch.

python -m experiments.bench.memory --size-mb 256
The server reports its own peak RSS (getrusage) in its --out JSON. The baseline is 3 x the model
(parameters + Adam's two moments) plus the peak RSS of a process that only imports torch, measured
in the same run. A worker's extra memory is measured the same way against its model's size.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from psrv.client import PSClient
from psrv.server.partition import ParamSpec, PartitionPlan

BARE = "import resource, torch; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"


def bare_torch_rss() -> int:
    return int(subprocess.run([sys.executable, "-c", BARE], capture_output=True, text=True, check=True).stdout)


def server_rss(size_mb: int, tmp: Path) -> int:
    ready, out = tmp / "mem.addr", tmp / "mem.json"
    server = subprocess.Popen([sys.executable, "-m", "psrv.cli", "serve", "--bind", "tcp://127.0.0.1:0",
                               "--workers", "1", "--mode", "async", "--optimizer", "adam", "--lr", "1e-4",
                               "--log-level", "WARNING", "--ready-file", str(ready), "--out", str(out)],
                              stdout=subprocess.DEVNULL)
    try:
        while not ready.exists():
            if server.poll() is not None:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        plan = PartitionPlan((ParamSpec("w", (size_mb * 2**20 // 4,)),), 1)
        weights = torch.zeros(plan.total)
        with PSClient([ready.read_text().strip()], plan, worker=0, world_size=1, timeout=300) as c:
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


def run(size_mb: int) -> list[dict]:
    bare = bare_torch_rss()
    with tempfile.TemporaryDirectory(prefix="psrv-mem-") as d:
        peak = server_rss(size_mb, Path(d))
    model = size_mb * 2**20
    baseline = 3 * model + bare
    return [{"bench": "memory", "role": "server", "size_mb": size_mb, "optimizer": "adam", "peak_rss_bytes": peak,
             "bare_torch_bytes": bare, "baseline_bytes": baseline, "ratio": peak / baseline}]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    for r in run(a.size_mb):
        print(f"server {r['size_mb']} MB adam: peak RSS {r['peak_rss_bytes']/2**20:.0f} MiB, baseline "
              f"{r['baseline_bytes']/2**20:.0f} MiB (3x model + bare torch), {r['ratio']:.2f}x")
        if a.out:
            a.out.write_text(json.dumps([r], indent=1))


if __name__ == "__main__":
    main()
