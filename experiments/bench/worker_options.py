"""worker_options: what each worker-side optimisation buys, end to end, against the same run without it.

python -m psrv.experiments.bench.worker_options --job synthetic_mlp --repeats 2
The job runs async with 2 servers and 2 workers on 127.0.0.1, in four variants alternated within each
repeat: neither option, --overlap (each shard's slice pushed as soon as backward finishes it),
--wire-dtype bfloat16 (half the push bytes), and both. Each figure is the median samples/s as a ratio
to the median of the variant with neither, from the same invocation. The final held-out loss of each
is kept beside it: the check that bfloat16 gradients did not cost accuracy.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from psrv.config import RunConfig, from_dict

from psrv.experiments.launcher.launch import run_local

VARIANTS = {"baseline": (False, "float32"), "overlap": (True, "float32"),
            "bfloat16": (False, "bfloat16"), "overlap+bfloat16": (True, "bfloat16")}


def run(job: str, repeats: int, steps: int, *, servers: int = 2, workers: int = 2,
        variants: tuple[str, ...] = tuple(VARIANTS)) -> list[dict]:
    rates: dict[str, list[float]] = {v: [] for v in variants}
    losses: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="psrv-options-") as d:
        for rep in range(repeats):
            for name in variants:
                overlap, dtype = VARIANTS[name]
                cfg = from_dict(RunConfig, {"mode": "async", "cluster": {"servers": servers, "workers": workers},
                                            "job": {"name": job, "steps": steps, "batch_size": 32},
                                            "optimizer": {"lr": 0.01, "momentum": 0.9},
                                            "worker": {"overlap": overlap, "wire_dtype": dtype}})
                summary = run_local(cfg, out=Path(d) / f"{name}-{rep}", progress=False)
                rates[name].append(summary["samples_per_second"])
                losses[name].append(summary["final_loss"])
    base = statistics.median(rates["baseline"])
    return [{"bench": "worker_options", "job": job, "variant": name, "overlap": VARIANTS[name][0],
             "wire_dtype": VARIANTS[name][1], "servers": servers, "workers": workers, "steps": steps,
             "samples_per_second": statistics.median(rates[name]), "spread": [min(rates[name]), max(rates[name])],
             "baseline_samples_per_second": base, "ratio": statistics.median(rates[name]) / base,
             "final_loss": statistics.median(losses[name]), "repeats": repeats} for name in variants]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="synthetic_mlp", help="job to train (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each variant (default: %(default)s)")
    p.add_argument("--steps", type=int, default=40, help="steps per worker (default: %(default)s)")
    p.add_argument("--out", type=Path, help="also write the rows here (JSON)")
    a = p.parse_args(argv)
    rows = run(a.job, a.repeats, a.steps)
    for r in rows:
        print(f"{r['variant']:>17}: {r['samples_per_second']:8.0f} samples/s  {r['ratio']:.2f}x baseline"
              f"  final loss {r['final_loss']:.4f}")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
