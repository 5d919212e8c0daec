"""apply: the server's optimizer step on one shard, as bytes touched per second, against memcpy.

python -m psrv.experiments.bench.apply --size-mb 64 --repeats 9
memcpy is torch's copy_ of a tensor of the same size (2 x size bytes touched: read + write). An SGD
step with momentum touches 5 x size (read param, grad, buffer; write param, buffer), an Adam step
7 x size (read param, grad, m, v; write param, m, v). A `sync` row times a sync clock's step of two
accumulated pushes (Shard.apply_accumulated: the mean, then the step): as many useful bytes, since the fused
kernel divides the sum by the count in its own pass (psrv/server/optim.py); `divide_first_seconds` times the same
step with the sum divided in a pass of its own first (then Shard.apply of the mean: the path before that),
interleaved with it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from psrv.config import OptimConfig
from psrv.server.shard import Shard

TOUCHED = {"sgd": 5, "adam": 7}


def _time(fn, repeats: int, before=lambda: None, *, warm: bool = True) -> list[float]:
    if warm:
        before()
        fn()  # warm-up: first touch of every page, optimizer state created
    out = []
    for _ in range(repeats):
        before()  # untimed
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _sync_steps(n: int, cfg: OptimConfig, src: torch.Tensor, grads: list[torch.Tensor], repeats: int) -> tuple[list, list]:
    """A sync clock's step as psrv takes it (apply_accumulated of `grads`: the division in the fused step's pass),
    and the same step with the sum divided first (a pass of its own, then Shard.apply of the mean: the path before),
    each on its own shard, taken in turns; the sums are made untimed."""
    folded, first = Shard(n, cfg), Shard(n, cfg)
    folded.init(src)
    first.init(src)
    total = torch.empty(n)

    def sum_into_total():
        torch.add(grads[0], grads[1], out=total)
        for g in grads[2:]:
            total.add_(g)

    def divide_then_step():
        total.div_(len(grads))
        first.apply(total)
    def accumulate():
        for g in grads:
            folded.accumulate(g)
    steps = ((folded.apply_accumulated, accumulate), (divide_then_step, sum_into_total))
    for fn, before in steps:  # warm-up: first touch of every page, optimizer state created
        before()
        fn()
    times: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for (fn, before), out in zip(steps, times):
            out.extend(_time(fn, 1, before, warm=False))
    return times


def run(size_mb: int, repeats: int) -> list[dict]:
    n = size_mb * 2**20 // 4
    src, dst = torch.randn(n), torch.empty(n)
    memcpy = statistics.median(_time(lambda: dst.copy_(src), repeats))
    memcpy_rate = 2 * n * 4 / memcpy
    results = []
    for name, cfg in (("sgd", OptimConfig("sgd", lr=1e-3, momentum=0.9)), ("adam", OptimConfig("adam", lr=1e-3, momentum=0))):
        shard = Shard(n, cfg)
        shard.init(src)
        grad = torch.randn(n) * 1e-3
        times = _time(lambda: shard.apply(grad), repeats)
        med = statistics.median(times)
        rate = TOUCHED[name] * n * 4 / med
        results.append({"bench": "apply", "optimizer": name, "size_mb": size_mb, "step_seconds": med,
                        "spread": [min(times), max(times)], "bytes_per_second": rate,
                        "memcpy_bytes_per_second": memcpy_rate, "ratio": rate / memcpy_rate,
                        "threads": torch.get_num_threads(), "repeats": repeats})
        folded, first = _sync_steps(n, cfg, src, [grad, torch.randn(n) * 1e-3], repeats)
        med = statistics.median(folded)
        rate = TOUCHED[name] * n * 4 / med
        results.append({"bench": "apply", "optimizer": name, "step": "sync", "size_mb": size_mb, "step_seconds": med,
                        "spread": [min(folded), max(folded)], "divide_first_seconds": statistics.median(first),
                        "bytes_per_second": rate, "memcpy_bytes_per_second": memcpy_rate, "ratio": rate / memcpy_rate,
                        "threads": torch.get_num_threads(), "repeats": repeats})
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=64)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    results = run(a.size_mb, a.repeats)
    for r in results:
        first = f" (dividing first: {r['divide_first_seconds']*1e3:.1f} ms)" if "divide_first_seconds" in r else ""
        print(f"{r['optimizer']:>4} {r.get('step', 'push'):>4} {r['size_mb']} MB: {r['step_seconds']*1e3:.1f} ms/step, "
              f"{r['bytes_per_second']/1e9:.2f} GB/s touched, {r['ratio']:.2f}x memcpy{first}")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
