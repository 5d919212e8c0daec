"""replicas: what a replicated shard costs and how fast it fails over (docs/reliability.md).

python -m psrv.experiments.bench.replicas --kills 20        # failover seconds, median and max
python -m psrv.experiments.bench.replicas --throughput 2    # samples/s with --replicas 1 against 0

Failover: a `psrv serve` primary process with a backup (served from a thread of this process) and one
psrv.Worker pushing in a thread here; once the backup follows, the primary is SIGKILLed, and the failover
time is from the kill to the first push the new primary acknowledged (the worker's first step() to return
after it). Repeated with a fresh primary and backup for each kill.

Throughput: `psrv run` async with 2 servers and 2 workers, with --replicas 1 and without, alternated within
each repeat; the figure is the median samples/s with replicas as a ratio to the median without, from the same
invocation (the goal on one host: >= 0.85).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from psrv.config import RunConfig, ServerConfig, from_dict


def _primary(folder: Path) -> tuple[subprocess.Popen, str]:
    ready = folder / "primary.addr"
    proc = subprocess.Popen([sys.executable, "-P", "-m", "psrv.cli", "serve", "--bind", "tcp://127.0.0.1:0",
                             "--workers", "1", "--mode", "async", "--ready-file", str(ready),
                             "--log-level", "ERROR"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the primary did not start")
        time.sleep(0.05)
    return proc, ready.read_text().strip()


def one_failover(folder: Path, *, steps_before: int = 20, steps_after: int = 5) -> float:
    """Seconds from SIGKILL of a primary to the first push its backup acknowledged as the new primary."""
    import torch

    import psrv
    proc, address = _primary(folder)
    backup = psrv.Server(ServerConfig(workers=1, mode="async", backup_of=address)).start()
    try:
        deadline = time.monotonic() + 30
        while backup.service.follower is None or not backup.service.follower.following:
            if time.monotonic() > deadline:
                raise RuntimeError("the backup did not start following")
            time.sleep(0.01)
        model = torch.nn.Linear(64, 64)
        acked: list[float] = []
        with psrv.Worker(model, [address], rank=0, world_size=1, timeout=60.0) as ps:
            for step in range(steps_before + steps_after):
                if step == steps_before:
                    killed = time.monotonic()
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                model(torch.randn(8, 64)).square().mean().backward()
                ps.step()
                acked.append(time.monotonic())
        backup.join(30)
        return next(t for t in acked[steps_before:]) - killed
    finally:
        backup.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def failover(kills: int) -> dict:
    seconds = []
    with tempfile.TemporaryDirectory(prefix="psrv-failover-") as d:
        for i in range(kills):
            folder = Path(d) / str(i)
            folder.mkdir()
            seconds.append(one_failover(folder))
    return {"bench": "failover", "kills": kills, "ratio": statistics.median(seconds),
            "median_seconds": statistics.median(seconds),
            "max_seconds": max(seconds), "min_seconds": min(seconds), "seconds": seconds}


def throughput(repeats: int, steps: int, job: str = "synthetic_mlp") -> dict:
    """samples/s of an async run with --replicas 1 against the same run without, medians of `repeats`."""
    from psrv.experiments.launch import run_local
    rates: dict[int, list[float]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="psrv-replicas-") as d:
        for rep in range(repeats):
            for replicas in (0, 1):
                cfg = from_dict(RunConfig, {"mode": "async", "cluster": {"servers": 2, "workers": 2,
                                                                         "replicas": replicas},
                                            "job": {"name": job, "steps": steps, "batch_size": 32}})
                rates[replicas].append(run_local(cfg, out=Path(d) / f"{replicas}-{rep}", progress=False)
                                       ["samples_per_second"])
    base, with_ = statistics.median(rates[0]), statistics.median(rates[1])
    return {"bench": "replicas", "job": job, "mode": "async", "servers": 2, "workers": 2, "steps": steps,
            "repeats": repeats, "samples_per_second": with_, "baseline_samples_per_second": base,
            "ratio": with_ / base, "spread": [min(rates[1]), max(rates[1])]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=0, help="primaries to kill, one at a time (0: none)")
    p.add_argument("--throughput", type=int, default=0, metavar="REPEATS",
                   help="runs with --replicas 1 and without, each (0: none)")
    p.add_argument("--steps", type=int, default=100, help="steps per worker of the throughput runs")
    p.add_argument("--out", type=Path, help="also write the rows here (JSON)")
    a = p.parse_args(argv)
    rows = []
    if a.kills:
        rows.append(failover(a.kills))
        print(f"failover over {a.kills} kills: median {rows[-1]['median_seconds']:.2f} s, "
              f"max {rows[-1]['max_seconds']:.2f} s")
    if a.throughput:
        rows.append(throughput(a.throughput, a.steps))
        r = rows[-1]
        print(f"async 2x2 with --replicas 1: {r['samples_per_second']:.0f} samples/s vs "
              f"{r['baseline_samples_per_second']:.0f} without, {r['ratio']:.2f}x")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
