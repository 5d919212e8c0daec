"""step_profile: where a `psrv run` step's time goes, by process: the CPU each shard and worker spends per step.

python -m psrv.experiments.bench.step_profile --job digits_mlp --mode sync --steps 3000
python -m psrv.experiments.bench.step_profile --job synthetic_mlp --mode sync --steps 300
`psrv run` on this host (1 shard, 2 workers by default, batches of 32, SGD lr 0.01 momentum 0.9: the peers
bench's job), and over a window in the middle of the run (the steps from 30% to 80% of the way): the wall time
per worker step, and the CPU (user + system, /proc/PID/stat) that the shard and each worker spent in it, per
worker step. Then the medians of the step rows' own split (steps.csv of the whole run, after its first 10
steps): compute, communication (the round trip less the shard's wait) and wait (the shard holding the answer:
sync's barrier). The CPU the processes need per step against the cores there are says whether the run is
bound by CPU (their sum over the cores is near the wall time) or by hand-offs between them.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
ROLES = {"psrv.cli serve": "shard", "psrv.cli worker": "worker"}


def _cpu(pid: int) -> float:
    """User + system seconds of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _processes(root: int) -> dict[str, int]:
    """The shards and workers below `root` (the run's launcher), by name: shard-0, worker-0, worker-1, ..."""
    found: list[tuple[str, int]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            p = pid
            while p > 1 and p != root:
                p = _ppid(p)
        except (OSError, ValueError):
            continue
        role = next((r for marker, r in ROLES.items() if marker in cmd), None)
        if p == root and role is not None:
            found.append((role, pid))
    names: dict[str, int] = {}
    for role in ("shard", "worker"):
        for i, pid in enumerate(sorted(pid for r, pid in found if r == role)):
            names[f"{role}-{i}"] = pid
    return names


def _steps(out: Path, rank: int = 0) -> int:
    try:
        return int((out / f"worker-{rank}.progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


def profile(job: str, mode: str, steps: int, workers: int, out: Path, *, in_place: bool = False) -> dict:
    cmd = [str(Path(sys.executable).with_name("psrv")), "run", "--job", job, "--mode", mode, "--servers", "1",
           "--workers", str(workers), "--steps", str(steps), "--batch-size", "32", "--lr", "0.01",
           "--momentum", "0.9", "--no-progress", "--log-level", "WARNING", "--out", str(out)] + \
        (["--pull-in-place"] if in_place else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while _steps(out) < 0.3 * steps:
            if proc.poll() is not None:
                raise RuntimeError(f"psrv run ended before the window: {proc.stderr.read()[-2000:]}")
            time.sleep(0.02)
        pids = _processes(proc.pid)
        s0, t0 = _steps(out), time.monotonic()
        c0 = {name: _cpu(pid) for name, pid in pids.items()}
        while _steps(out) < 0.8 * steps and proc.poll() is None:
            time.sleep(0.02)
        s1, t1 = _steps(out), time.monotonic()
        c1 = {name: _cpu(pid) for name, pid in pids.items()}
    finally:
        if proc.wait(timeout=600):
            raise RuntimeError(f"psrv run failed: {proc.stderr.read()[-2000:]}")
    done = s1 - s0
    if done <= 0:
        raise RuntimeError("no steps in the window: give more --steps")
    rows = list(csv.DictReader((out / "steps.csv").open()))[10 * workers:]
    split = {k: statistics.median(float(r[k]) for r in rows) * 1e3
             for k in ("compute_seconds", "communication_seconds", "wait_seconds")}
    return {"wall_ms": (t1 - t0) / done * 1e3, "steps": done,
            "cpu_ms": {name: (c1[name] - c0[name]) / done * 1e3 for name in pids}, "split_ms": split}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m psrv.experiments.bench.step_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", default="digits_mlp")
    ap.add_argument("--mode", default="sync", choices=("sync", "async", "ssp"))
    ap.add_argument("--steps", type=int, default=3000, help="steps per worker (the window is 50%% of them)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pull-in-place", action="store_true", help="the run's workers compute on the shard's weights "
                    "where they lie (psrv run --pull-in-place)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="psrv-step-profile-") as tmp:
        got = profile(args.job, args.mode, args.steps, args.workers, Path(tmp) / "run", in_place=args.pull_in_place)
    cores = os.cpu_count() or 1
    cpu = got["cpu_ms"]
    print(f"{args.job} {args.mode}{', pulls in place' if args.pull_in_place else ''}, 1 shard, {args.workers} "
          f"workers: {got['wall_ms']:.3f} ms a worker step "
          f"(over {got['steps']} steps of worker 0)")
    print("| process | CPU ms per step | share of one core |")
    print("|---|---|---|")
    for name, ms in cpu.items():
        print(f"| {name} | {ms:.3f} | {ms / got['wall_ms']:.0%} |")
    total = sum(cpu.values())
    print(f"| all | {total:.3f} | {total / got['wall_ms']:.0%} of one core; {total / cores / got['wall_ms']:.0%} "
          f"of the {cores} |")
    s = got["split_ms"]
    print(f"step rows, medians: compute {s['compute_seconds']:.3f} ms, communication "
          f"{s['communication_seconds']:.3f} ms, wait {s['wait_seconds']:.3f} ms")


if __name__ == "__main__":
    main()
