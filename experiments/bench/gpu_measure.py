"""`make gpu-check`'s in-process figures: a GPU0 shard's optimizer step against a device-to-device copy of the
same bytes, and the host<->device copies of a GPU worker's step, pageable (as psrv does them now) against pinned.

Timed with the device synchronised before each clock read, median of `repeats` after one warm-up. On a
machine without CUDA, `apply(..., device="cpu")` times the same code against memcpy (make gpu-check
--rehearse: proves the code runs, and is no GPU figure); `copies` needs CUDA (pinned memory).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from psrv.config import OptimConfig
from psrv.server.shard import Shard

TOUCHED = {"sgd": 5, "adam": 7}  # bytes touched per element / 4, as experiments/bench/apply.py counts them
OPTIMIZERS = (("sgd", OptimConfig("sgd", lr=1e-3, momentum=0.9)), ("adam", OptimConfig("adam", lr=1e-3, momentum=0)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], repeats: int, device: torch.device) -> list[float]:
    """Seconds of each of `repeats` calls of fn after one warm-up, the device idle before and after each."""
    fn()
    _sync(device)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return out


def apply(size_mb: int, repeats: int, *, device: str = "cuda:0") -> list[dict]:
    """Rows `gpu_apply`: SGD (momentum 0.9) and Adam on one shard of `size_mb` on `device`, the gradient on the
    device (`grad`: device) and on the host as a push arrives there (`grad`: host, pageable: the shard copies
    it over first). Ratio: bytes the step touches per second against the device-to-device copy's (read +
    write) on the same device, interleaved in the same process."""
    dev = torch.device(device)
    n = size_mb * 2**20 // 4
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    copy = statistics.median(timed(lambda: dst.copy_(src), repeats, dev))
    copy_rate = 2 * n * 4 / copy
    rows = []
    for name, cfg in OPTIMIZERS:
        shard = Shard(n, cfg, device=device)
        shard.init(src)
        for where in ("device", "host"):
            grad = (torch.randn(n, device=dev) if where == "device" else torch.randn(n)) * 1e-3
            times = timed(lambda: shard.apply(grad), repeats, dev)
            step = statistics.median(times)
            rate = TOUCHED[name] * n * 4 / step
            rows.append({"bench": "gpu_apply", "device": device, "optimizer": name, "grad": where, "size_mb": size_mb,
                         "step_seconds": step, "spread": [min(times), max(times)], "bytes_per_second": rate,
                         "copy_seconds": copy, "copy_bytes_per_second": copy_rate, "ratio": rate / copy_rate,
                         "repeats": repeats})
        del shard
    return rows


def copies(size_mb: int, repeats: int, *, device: str = "cuda:0") -> list[dict]:
    """Rows `gpu_copy` for `size_mb` bytes (a model's gradient or weights), each direction and one step of a
    GPU worker (its push's D2H, then its pull's H2D), with the host side as psrv has it now against pinned:
    D2H into a fresh pageable tensor (`.cpu()`, as psrv/protocol/codec.py encodes a CUDA push) and into a
    reused pageable one; H2D from a reused pageable buffer (a received frame) and non_blocking as the pull
    copies it (psrv/client/psclient.py). Ratio: the pinned copy's time over this one's (1.0: as fast)."""
    dev = torch.device(device)
    n = size_mb * 2**20 // 4
    on_dev = torch.randn(n, device=dev)
    back = torch.empty_like(on_dev)
    pageable, pinned = torch.randn(n), torch.randn(n).pin_memory()

    def med(fn: Callable[[], object]) -> float:
        return statistics.median(timed(fn, repeats, dev))
    pinned_d2h = med(lambda: pinned.copy_(on_dev))
    pinned_h2d = med(lambda: back.copy_(pinned, non_blocking=True))
    measured = {
        ("d2h", "fresh pageable (.cpu(), psrv's push now)"): (med(lambda: on_dev.cpu()), pinned_d2h),
        ("d2h", "reused pageable"): (med(lambda: pageable.copy_(on_dev)), pinned_d2h),
        ("h2d", "reused pageable, non_blocking (psrv's pull now)"):
            (med(lambda: back.copy_(pageable, non_blocking=True)), pinned_h2d),
        ("step", "d2h fresh pageable + h2d pageable (psrv now)"):
            (med(lambda: (on_dev.cpu(), back.copy_(pageable, non_blocking=True))), pinned_d2h + pinned_h2d),
    }
    return [{"bench": "gpu_copy", "device": device, "direction": direction, "host": host, "size_mb": size_mb,
             "seconds": t, "gb_per_s": (2 if direction == "step" else 1) * n * 4 / t / 1e9,
             "pinned_seconds": base, "pinned_gb_per_s": (2 if direction == "step" else 1) * n * 4 / base / 1e9,
             "ratio": base / t, "repeats": repeats}
            for (direction, host), (t, base) in measured.items()]
