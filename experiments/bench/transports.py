"""transports: a whole job's samples/s over torch RPC against ZeroMQ, same run.

python -m psrv.experiments.bench.transports --job digits_mlp --repeats 3
digits_mlp, async, 1 shard and 2 workers on 127.0.0.1 (psrv run), once over each transport per repeat,
alternating, so that drifts in machine load fall on both alike. Over ZeroMQ, co-located processes share
memory (psrv run's default); torch RPC has no such plane. The ratio is RPC's median over ZeroMQ's; each
side's spread is its min and max over the repeats. A small model's steps are round trips more than bytes:
this measures the transports' per-call costs (experiments/bench/rpc_vs_zmq.py times bare round trips by size).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.launch import run_local

TRANSPORTS = ("zmq", "rpc")


def run(job: str = "digits_mlp", repeats: int = 3, steps: int = 300, workers: int = 2, mode: str = "async") -> list[dict]:
    rates: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    with tempfile.TemporaryDirectory(prefix="psrv-transports-") as d:
        for rep in range(repeats):
            for transport in TRANSPORTS:
                cfg = from_dict(RunConfig, {"mode": mode,
                                            "cluster": {"servers": 1, "workers": workers, "transport": transport},
                                            "job": {"name": job, "steps": steps, "batch_size": 32},
                                            "optimizer": {"lr": 0.01, "momentum": 0.9}})
                summary = run_local(cfg, out=Path(d) / f"{transport}-{rep}", progress=False)
                if summary["transport"] != transport or not summary["complete"]:
                    raise RuntimeError(f"transports: the {transport} run ran over {summary['transport']}, "
                                       f"complete {summary['complete']}")
                rates[transport].append(summary["samples_per_second"])
    zmq, rpc = statistics.median(rates["zmq"]), statistics.median(rates["rpc"])
    return [{"bench": "transports", "job": job, "mode": mode, "workers": workers, "servers": 1, "steps": steps,
             "repeats": repeats, "samples_per_second": rpc, "baseline_samples_per_second": zmq, "ratio": rpc / zmq,
             "spread": [min(rates["rpc"]), max(rates["rpc"])],
             "baseline_spread": [min(rates["zmq"]), max(rates["zmq"])]}]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="digits_mlp")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    results = run(a.job, a.repeats, a.steps)
    for r in results:
        print(f"{r['job']} {r['mode']}, {r['workers']} workers: rpc {r['samples_per_second']:.0f} samples/s "
              f"(spread {r['spread'][0]:.0f} to {r['spread'][1]:.0f}) vs zmq {r['baseline_samples_per_second']:.0f} "
              f"({r['baseline_spread'][0]:.0f} to {r['baseline_spread'][1]:.0f}): {r['ratio']:.2f}x")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
