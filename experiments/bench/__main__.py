"""`make bench`: every benchmark, each figure a ratio against a baseline measured in the same run.

python -m psrv.experiments.bench            # the full suite (about 10 minutes on 2 cores; make bench)
python -m psrv.experiments.bench --smoke    # tiny sizes, under a minute: proves the bench still runs
python -m psrv.experiments.bench --only wire apply         # a subset
python -m psrv.experiments.bench --markdown bench/results.json   # the table for docs/benchmarks.md
Writes bench/results.json and prints a table; each figure says whether it meets its goal.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from psrv.experiments.bench import (apply, checkpoint_latency, colocated, end_to_end, failover, memory, metrics_overhead,
                                    peers, replicas, scaling, startup, transports, wire, worker_options)


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cores": os.cpu_count(), "cpu": cpu, "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


# The smoke's benches whose shards are threads of this process: their rows say so (`shards`: "threads")
SMOKE_THREADED = {"wire", "colocated", "scaling", "memory"}


def _threaded(name: str, row: dict) -> bool:
    return name in SMOKE_THREADED and not (name == "memory" and row.get("role") == "server")


def suite(smoke: bool) -> list[tuple[str, Callable[[], list[dict]]]]:
    """(name, thunk) per benchmark, in running order."""
    # Every bench at its smallest: one shard, one load generator, one worker, async against DDP, one
    # run of each side of memory's worker row. Shards whose being processes the smoke does not need
    # are served from threads of this process (experiments/bench/shards.py), and scaling's load
    # generator runs in one too: each process started is an import of torch, and the smoke proves each
    # bench runs, not how fast.
    if smoke:
        return [("wire", lambda: wire.run([1], [1], ["tcp"], 3, planes=("zmq", "bulk"), in_thread=True)),
                ("colocated", lambda: colocated.run([1], 3, pushes=("shared", "in place"), in_thread=True)),
                ("apply", lambda: apply.run(4, 3)),
                ("scaling", lambda: scaling.run([1, 4], 1.0, procs=1, in_thread=True)),
                ("memory", lambda: memory.run(16, "synthetic_mlp", 2, repeats=1, in_thread=True)),
                ("end_to_end", lambda: end_to_end.run(["digits_mlp"], 1, steps={"digits_mlp": 10},
                                                      variants=(("async", 0), ("ddp", 0)), workers=1)),
                ("worker_options", lambda: worker_options.run("digits_mlp", 1, 10, servers=1, workers=1,
                                                              variants=("baseline", "overlap+bfloat16"))),
                ("transports", lambda: transports.run(repeats=1, steps=10, workers=1)),
                ("peers", lambda: peers.run((("torch_rpc_example", "digits_mlp", "async", 1),), repeats=1,
                                            steps={"digits_mlp": 10})),
                ("metrics_overhead", lambda: metrics_overhead.run(10, 1, workers=1)),
                ("startup", lambda: startup.run(1, servers=1, workers=2, steps=5)),
                ("failover", lambda: [failover.run(2)])]
    return [("wire", lambda: wire.run([1, 16, 64, 256], [1, 2], ["tcp", "ipc"], 7, planes=("zmq", "bulk"))),
            ("colocated", lambda: colocated.run([16, 64], 9)),
            ("apply", lambda: apply.run(64, 9)),
            ("end_to_end", lambda: end_to_end.run(["synthetic_mlp", "digits_mlp"], 2)),
            ("transports", lambda: transports.run("digits_mlp", 3)),
            ("peers", lambda: peers.run(repeats=3)),
            ("worker_options", lambda: worker_options.run("synthetic_mlp", 2, 40)),
            ("scaling", lambda: scaling.run([1, 4, 16, 32, 64], 3.0, repeats=3)),
            ("memory", lambda: memory.run(256)),
            ("metrics_overhead", lambda: metrics_overhead.run(1500, 3)),
            ("startup", lambda: startup.run(3)),
            ("checkpoint_latency", lambda: checkpoint_latency.run(256, 30)),
            ("replicas", lambda: [replicas.throughput(3, 100)]),
            ("failover", lambda: [failover.run(100)])]


def goal(r: dict) -> tuple[str, float] | None:
    """The issue's goal for this figure as (">=" or "<=", threshold); None where none is set."""
    b = r["bench"]
    if b == "wire" and r.get("plane") == "bulk":  # remote hosts: 64 MB, 1 shard, against a raw socket echo
        return (">=", 0.8) if r["size_mb"] >= 64 and r["shards"] == 1 else None
    if b == "wire":
        return (">=", 0.8) if r["size_mb"] >= 16 else None
    if b == "apply":
        return (">=", 0.5)
    if b == "colocated":  # as psrv.Worker pushes: from its flat gradient in shared memory; and pulls in place
        return {"shared": (">=", 0.5), "in place": (">=", 0.8)}.get(r["push"]) if r["size_mb"] >= 64 else None
    if b == "scaling":
        return (">=", 0.8) if r["workers"] == 32 else None
    if b == "memory":
        return ("<=", 1.2) if r["role"] == "server" else ("<=", 2.0)
    if b == "end_to_end" and r["job"] == "synthetic_mlp":
        return {"sync": (">=", 1.0), "sync-in-place": (">=", 1.0), "async": (">=", 1.3)}.get(r["variant"])
    if b == "metrics_overhead":
        return (">=", 0.98)
    if b == "transports":  # a job's samples/s over torch RPC against ZeroMQ
        return (">=", 0.5)
    if b == "peers":  # psrv's samples/s against a peer's parameter-server example, same job and mode
        return (">=", 3.0)
    if b == "startup":  # launch to the first step, forked from the fork server against each process started itself
        return ("<=", 0.8)
    if b == "checkpoint_latency":  # push p99 while a 256 MB Adam shard checkpoints, against without
        return ("<=", 2.0) if r["size_mb"] >= 256 else None
    if b == "replicas":  # async samples/s with --replicas 1 against 0, one host
        return (">=", 0.85)
    if b == "failover":  # its ratio is the median failover in seconds (its p99 has a goal of 2 s too)
        return ("<=", 1.0)
    if b == "chaos":  # goodput under a fault every 7 s against the fault-free run (make chaos, experiments/bench/chaos.py)
        return (">=", 0.95)
    return None


def judge(r: dict) -> None:
    """Add goal and goal_met to r, from the ratio measured in this run."""
    g = goal(r)
    if g is not None:
        op, x = g
        r["goal"] = f"{op} {x}"
        r["goal_met"] = r["ratio"] >= x if op == ">=" else r["ratio"] <= x


def describe(r: dict) -> str:
    b = r["bench"]
    if b == "wire":  # (rows from before the bulk plane carry neither plane nor baseline: zmq against its echo)
        return (f"wire {r['endpoint']} {r['size_mb']} MB x{r['shards']} over {r.get('plane', 'zmq')}: "
                f"{r['psrv_seconds']*1e3:.1f} ms vs {r.get('baseline', 'zmq_echo')} {r['raw_seconds']*1e3:.1f} ms")
    if b == "colocated":
        return (f"colocated {r['size_mb']} MB push from {r['push']} over {r['plane']}: {r['psrv_gb_per_s']:.2f} GB/s "
                f"vs memcpy {r['memcpy_gb_per_s']:.2f} GB/s")
    if b == "apply":
        first = f" (dividing first {r['divide_first_seconds']*1e3:.1f} ms)" if "divide_first_seconds" in r else ""
        return (f"apply {r['optimizer']} {r.get('step', 'push')} {r['size_mb']} MB: {r['bytes_per_second']/1e9:.2f} GB/s "
                f"vs memcpy {r['memcpy_bytes_per_second']/1e9:.2f}{first}")
    if b == "end_to_end":
        total = sum(r.get("payload_bytes", {}).values())
        paths = ", ".join(f"{k} {v / total:.0%}" for k, v in r["payload_bytes"].items() if v) if total else ""
        pulls = f", {_pulls(r)}" if "pulls_copied" in r else ""
        return (f"e2e {r['job']} {r['variant']}: {r['samples_per_second']:.0f} samples/s vs DDP "
                f"{r['ddp_samples_per_second']:.0f}" + (f" (tensor bytes: {paths}{pulls})" if paths else ""))
    if b == "scaling":
        return f"scaling {r['workers']} workers: {r['updates_per_second']:.0f} updates/s"
    if b == "worker_options":
        return (f"options {r['job']} {r['variant']}: {r['samples_per_second']:.0f} samples/s vs "
                f"{r['baseline_samples_per_second']:.0f}, loss {r['final_loss']:.3f}")
    if b == "peers":
        pulls = f" ({_pulls(r)})" if "pulls_copied" in r else ""
        return f"peers {r['job']} {r['mode']} x{r['workers']}: " + _versus(r, "psrv", r["peer"]) + pulls
    if b == "transports":
        return f"transports {r['job']} {r['mode']} {r['servers']}x{r['workers']}: " + _versus(r, "rpc", "zmq")
    if b == "metrics_overhead":
        return f"metrics {r['job']} {r['mode']}: {r['steps_per_second_on']:.1f} steps/s on vs {r['steps_per_second_off']:.1f} off"
    if b == "startup":
        return (f"startup {r['servers']} shards x {r['workers']} workers: first step {r['forked_first_step_seconds']:.2f} s "
                f"forked vs {r['started_first_step_seconds']:.2f} s started one by one (runs {r['forked_run_seconds']:.1f} "
                f"vs {r['started_run_seconds']:.1f} s)")
    if b == "checkpoint_latency":
        return (f"checkpoint {r['size_mb']} MB {r['optimizer']}, {r['workers']} workers pushing: push p99 "
                f"{r['p99_on'] * 1e3:.0f} ms during writes vs {r['p99_off'] * 1e3:.0f} ms without")
    if b == "replicas":
        spread = (f" (spread {r['spread'][0]:.0f} to {r['spread'][1]:.0f} vs {r['baseline_spread'][0]:.0f} to "
                  f"{r['baseline_spread'][1]:.0f})" if "baseline_spread" in r else "")
        return (f"replicas {r['job']} {r['mode']} {r['servers']}x{r['workers']}: {r['samples_per_second']:.0f} "
                f"samples/s with --replicas 1 vs {r['baseline_samples_per_second']:.0f} without{spread}")
    if b == "chaos":
        return (f"chaos {r['mode']} {r['job']}, {r['workers']} workers, {r['servers']} shards, --replicas {r['replicas']}: "
                f"{r['faults']} faults" + (f" in {r['wall_seconds'] / 60:.0f} min" if r["wall_seconds"] else "") +
                (f", run FAILED ({r['failed']})" if r.get("failed") else "") + f", {r['violations']} violations; goodput "
                f"{r['samples_per_second']:.0f} vs {r['baseline_samples_per_second']:.0f} useful samples/s (ratio)")
    if b == "failover":
        bound = f", --failure-bound {r['failure_bound']:g}" if "failure_bound" in r else ""  # (older rows: 1 s)
        spread = (f"p90 {r['p90_seconds']:.2f}, p99 {r['p99_seconds']:.2f}, min {r['min_seconds']:.2f}, "
                  if "p99_seconds" in r else "")
        return (f"failover, kill -9 of a primary to the new primary's first ack, over {r['kills']} kills{bound}: median "
                f"{r['median_seconds']:.2f} s, {spread}max {r['max_seconds']:.2f} s (ratio: the median, in seconds)")
    if r["role"] == "worker":
        return (f"memory worker {r['job']}: {r['peak_rss_bytes']/2**20:.0f} MiB vs plain torch "
                f"{r['baseline_bytes']/2**20:.0f} MiB, in model sizes" + (f", median of {r['repeats']}" if "repeats" in r else ""))
    return f"memory server {r['size_mb']} MB adam: {r['peak_rss_bytes']/2**20:.0f} MiB vs {r['baseline_bytes']/2**20:.0f} MiB"


def _pulls(r: dict) -> str:
    """A row's pulls under --pull-in-place: those read in place and those copied."""
    return f"pulls in place {r['pulls_in_place']} copied {r['pulls_copied']}"


def _versus(r: dict, ours: str, theirs: str) -> str:
    """Two medians of samples/s, each with its spread over the repeats (min to max)."""
    return (f"{ours} {r['samples_per_second']:.0f} samples/s ({r['spread'][0]:.0f} to {r['spread'][1]:.0f}) vs "
            f"{theirs} {r['baseline_samples_per_second']:.0f} ({r['baseline_spread'][0]:.0f} to {r['baseline_spread'][1]:.0f})")


def markdown(doc: dict) -> str:
    """A results.json as the Markdown table docs/benchmarks.md carries."""
    m = doc["machine"]
    lines = [f"{m['cores']} cores, {m['cpu']}, torch {m['torch']}, Python {m['python']}, {m['date']}; "
             f"seconds per bench: {doc.get('bench_seconds', {})}", "",
             "| figure | ratio | goal |", "|---|---|---|"]
    for r in doc["results"]:
        goal = "" if "goal" not in r else f"{r['goal']}: {'met' if r['goal_met'] else '**not met**'}"
        lines.append(f"| {describe(r)} | {r['ratio']:.2f} | {goal} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, under a minute")
    p.add_argument("--only", nargs="+", metavar="BENCH", help="run only these benches (names as printed)")
    p.add_argument("--out", type=Path, default=Path("bench/results.json"), help="default: %(default)s")
    p.add_argument("--markdown", type=Path, metavar="RESULTS",
                   help="print an existing results.json as a Markdown table and exit (runs nothing)")
    a = p.parse_args(argv)
    if a.markdown:
        print(markdown(json.loads(a.markdown.read_text())))
        return 0
    results, seconds = [], {}
    benches = suite(a.smoke)
    if a.only:
        unknown = set(a.only) - {name for name, _ in benches}
        if unknown:
            p.error(f"unknown bench {', '.join(sorted(unknown))}; choose from {', '.join(n for n, _ in benches)}")
        benches = [(n, f) for n, f in benches if n in a.only]
    for i, (name, thunk) in enumerate(benches, 1):
        print(f"[{i}/{len(benches)}] {name} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        rows = thunk()
        seconds[name] = round(time.monotonic() - t0, 1)
        for r in rows:
            judge(r)
            if a.smoke and _threaded(name, r):  # not the process a user's shard is: no figure to quote
                r["shards"] = "threads"
        results += rows
        print(f"[{i}/{len(benches)}] {name}: {len(rows)} figures in {seconds[name]:.0f} s", file=sys.stderr, flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"machine": machine(), "smoke": a.smoke, "bench_seconds": seconds,
                                 "results": results}, indent=1))
    width = max(len(describe(r)) for r in results)
    for r in results:
        met = "" if "goal" not in r else f"  goal {r['goal']}: {'met' if r['goal_met'] else 'NOT met'}"
        where = "  (shards in threads)" if r.get("shards") == "threads" else ""
        print(f"{describe(r):<{width}}  ratio {r['ratio']:.2f}{met}{where}")
    print(f"\nwrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
