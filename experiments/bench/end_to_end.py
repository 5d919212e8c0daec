"""end_to_end: samples/s of one job under sync PS (pulls copied, and read in place), async PS, ssp(2) and DDP (gloo),
same run.

python -m psrv.experiments.bench.end_to_end --jobs synthetic_mlp digits_mlp --repeats 2
2 workers and 1 server on 127.0.0.1; samples/s counts the training window (first step to last). Each
PS row says by which path its tensor bytes went, summed over its runs (`payload_bytes`, as summary.json:
inline, shm, bulk); as psrv run starts them, co-located processes share memory.
Each PS figure is reported as a ratio to DDP's median from the same invocation; modes alternate
within a repeat so that drifts in machine load fall on every mode alike.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from psrv.config import RunConfig, from_dict

from psrv.experiments.launcher.launch import run_local

VARIANTS = (("sync", 0), ("sync-in-place", 0), ("async", 0), ("ssp", 2), ("ddp", 0))
IN_PLACE = "-in-place"  # a mode's suffix: --pull-in-place (the model computes on the shard's weights in place)
STEPS = {"synthetic_mlp": 40, "digits_mlp": 300, "mnist1d_mlp": 300}


def run_tree(mode: str) -> dict:
    """The config tree's part a bench mode sets: `mode` itself, or its IN_PLACE form (that mode, --pull-in-place)."""
    return {"mode": mode.removesuffix(IN_PLACE), "worker": {"pull_in_place": mode.endswith(IN_PLACE)}}


def add_pulls(pulls: dict, summary: dict) -> None:
    """A run's pulls read in place and copied (summary.json's, under --pull-in-place) added into `pulls`."""
    for key in ("pulls_in_place", "pulls_copied"):
        if key in summary:
            pulls[key] = pulls.get(key, 0) + summary[key]


def run(jobs: list[str], repeats: int, steps: dict[str, int] | None = None,
        variants: tuple[tuple[str, int], ...] = VARIANTS, workers: int = 2) -> list[dict]:
    """`variants` ((mode, staleness), ...) must include ddp: every figure is a ratio to it."""
    steps = {**STEPS, **(steps or {})}
    results = []
    with tempfile.TemporaryDirectory(prefix="psrv-e2e-") as d:
        for job in jobs:
            rates: dict[str, list[float]] = {}
            paths: dict[str, dict[str, int]] = {}
            pulls: dict[str, dict[str, int]] = {}
            for rep in range(repeats):
                for mode, s in variants:
                    name = mode if mode != "ssp" else f"ssp-{s}"
                    cfg = from_dict(RunConfig, {**run_tree(mode), "staleness": s,
                                                "cluster": {"servers": 1, "workers": workers},
                                                "job": {"name": job, "steps": steps[job], "batch_size": 32},
                                                "optimizer": {"lr": 0.01, "momentum": 0.9}})
                    summary = run_local(cfg, out=Path(d) / f"{job}-{name}-{rep}", progress=False)
                    rates.setdefault(name, []).append(summary["samples_per_second"])
                    for path, n in summary.get("payload_bytes", {}).items():  # PS runs only
                        sums = paths.setdefault(name, {})
                        sums[path] = sums.get(path, 0) + n
                    add_pulls(pulls.setdefault(name, {}), summary)
            ddp = statistics.median(rates["ddp"])
            for name, values in rates.items():
                med = statistics.median(values)
                results.append({"bench": "end_to_end", "job": job, "variant": name, "samples_per_second": med,
                                "spread": [min(values), max(values)], "ddp_samples_per_second": ddp,
                                "ratio": med / ddp, "repeats": repeats, "steps": steps[job], "workers": workers,
                                **({"payload_bytes": paths[name]} if name in paths else {}), **pulls.get(name, {})})
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", nargs="+", default=["synthetic_mlp", "digits_mlp"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    results = run(a.jobs, a.repeats)
    for r in results:
        print(f"{r['job']:>14} {r['variant']:>13}: {r['samples_per_second']:8.0f} samples/s  {r['ratio']:.2f}x DDP")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
