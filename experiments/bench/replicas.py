"""replicas: what a replicated shard costs and how fast it fails over (docs/reliability.md).

python -m psrv.experiments.bench.replicas --kills 100                        # failover seconds (--failure-bound 1)
python -m psrv.experiments.bench.replicas --kills 100 --failure-bound 1 0.5  # a row per bound
python -m psrv.experiments.bench.replicas --throughput 3                     # samples/s with --replicas 1 against 0

Failover (experiments/bench/failover.py): one long run of a replicated shard whose primary is killed with
SIGKILL again and again, each time once a new backup follows its successor; per kill, the seconds from the kill
to the first push the new primary acknowledged; the row gives their median, p90, p99, min and max.

Throughput: `psrv run` async with 2 servers and 2 workers, with --replicas 1 and without, alternated within
each repeat; the figure is the median samples/s with replicas as a ratio to the median without, from the same
invocation (the goal on one host: >= 0.85).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from psrv.config import RunConfig, from_dict
from psrv.experiments.bench import failover


def throughput(repeats: int, steps: int, job: str = "synthetic_mlp") -> dict:
    """samples/s of an async run with --replicas 1 against the same run without, medians of `repeats`."""
    from psrv.experiments.launcher.launch import run_local
    rates: dict[int, list[float]] = {0: [], 1: []}
    load = os.getloadavg()[0]  # before its own processes (4 to 6 of them) add theirs
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
            "ratio": with_ / base, "spread": [min(rates[1]), max(rates[1])],
            "baseline_spread": [min(rates[0]), max(rates[0])],
            "ratios": [w / b for w, b in zip(rates[1], rates[0])],  # each repeat's pair, run back to back
            "load_average_at_start": load, "load_average": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=0, help="primaries to kill, one at a time (0: none)")
    p.add_argument("--failure-bound", type=float, nargs="+", default=[1.0], metavar="SECONDS",
                   help="the shard's --failure-bound; several: a failover row for each (default: 1)")
    p.add_argument("--throughput", type=int, default=0, metavar="REPEATS",
                   help="runs with --replicas 1 and without, each (0: none)")
    p.add_argument("--steps", type=int, default=100, help="steps per worker of the throughput runs")
    p.add_argument("--out", type=Path, help="also write the rows here (JSON)")
    a = p.parse_args(argv)
    rows = []
    for bound in a.failure_bound if a.kills else ():
        r = failover.run(a.kills, bound=bound)
        rows.append(r)
        print(f"failover over {a.kills} kills, --failure-bound {bound:g}: median {r['median_seconds']:.3f} s, "
              f"p90 {r['p90_seconds']:.3f}, p99 {r['p99_seconds']:.3f}, min {r['min_seconds']:.3f}, "
              f"max {r['max_seconds']:.3f} (load average {r['load_average'][0]:.1f})")
    if a.throughput:
        rows.append(throughput(a.throughput, a.steps))
        r = rows[-1]
        print(f"async 2x2 with --replicas 1: {r['samples_per_second']:.0f} samples/s (spread {r['spread'][0]:.0f} to "
              f"{r['spread'][1]:.0f}) vs {r['baseline_samples_per_second']:.0f} without ({r['baseline_spread'][0]:.0f} "
              f"to {r['baseline_spread'][1]:.0f}), {r['ratio']:.2f}x; each repeat's pair: "
              f"{', '.join(f'{x:.2f}' for x in r['ratios'])} (load average {r['load_average_at_start']:.1f} at the start, "
              f"{r['load_average'][0]:.1f} at the end)")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
