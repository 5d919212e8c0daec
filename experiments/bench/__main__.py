"""`make bench`: every benchmark, each figure a ratio against a baseline measured in the same run.

python -m experiments.bench            # the full suite (about 10 minutes on 2 cores)
python -m experiments.bench --smoke    # tiny sizes, under a minute: proves the bench still runs
Writes bench/results.json and prints a table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch

from experiments.bench import apply, end_to_end, memory, metrics_overhead, scaling, wire

GOALS = {"wire": 0.8, "apply": 0.5, "scaling": 0.8, "memory": 1.2, "metrics_overhead": 0.98}


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cores": os.cpu_count(), "cpu": cpu, "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def suite(smoke: bool) -> list[dict]:
    if smoke:  # every bench at its smallest: one shard, one load generator, async and DDP, 1 worker for metrics
        return (wire.run([1], [1], ["tcp"], 3) + apply.run(4, 3) + scaling.run([1, 4], 1.0, procs=1)
                + memory.run(16) + end_to_end.run(["digits_mlp"], 1, steps={"digits_mlp": 10},
                                                  variants=(("async", 0), ("ddp", 0)))
                + metrics_overhead.run(10, 1, workers=1))
    return (wire.run([1, 16, 64, 256], [1, 2], ["tcp", "ipc"], 7) + apply.run(64, 9)
            + end_to_end.run(["synthetic_mlp", "digits_mlp"], 2) + scaling.run([1, 4, 16, 32, 64], 5.0)
            + memory.run(256) + metrics_overhead.run(300, 2))


def describe(r: dict) -> str:
    b = r["bench"]
    if b == "wire":
        return f"wire {r['endpoint']} {r['size_mb']} MB x{r['shards']}: {r['psrv_seconds']*1e3:.1f} ms vs raw {r['raw_seconds']*1e3:.1f} ms"
    if b == "apply":
        return f"apply {r['optimizer']} {r['size_mb']} MB: {r['bytes_per_second']/1e9:.2f} GB/s vs memcpy {r['memcpy_bytes_per_second']/1e9:.2f}"
    if b == "end_to_end":
        return f"e2e {r['job']} {r['variant']}: {r['samples_per_second']:.0f} samples/s vs DDP {r['ddp_samples_per_second']:.0f}"
    if b == "scaling":
        return f"scaling {r['workers']} workers: {r['updates_per_second']:.0f} updates/s"
    if b == "metrics_overhead":
        return f"metrics {r['job']} {r['mode']}: {r['steps_per_second_on']:.1f} steps/s on vs {r['steps_per_second_off']:.1f} off"
    return f"memory server {r['size_mb']} MB adam: {r['peak_rss_bytes']/2**20:.0f} MiB vs {r['baseline_bytes']/2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, under a minute")
    p.add_argument("--out", type=Path, default=Path("bench/results.json"))
    a = p.parse_args(argv)
    results = suite(a.smoke)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"machine": machine(), "smoke": a.smoke, "results": results}, indent=1))
    width = max(len(describe(r)) for r in results)
    for r in results:
        print(f"{describe(r):<{width}}  ratio {r['ratio']:.2f}")
    print(f"\nwrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
