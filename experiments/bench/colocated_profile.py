"""colocated_profile: where a co-located PUSH_PULL's time goes, pass by pass, with the bytes each moves.

python -m psrv.experiments.bench.colocated_profile --size-mb 64 --repeats 30
The round trip of experiments/bench/colocated.py (a push from the worker's shared gradient to one shard on
this host, `--shared-memory auto`, SGD without momentum, the weights pulled into the worker's buffer), timed
from inside: the worker's passes by wrapping the functions its round trip calls (its finiteness sum, which
a chunked push needs first and a push read in place skips: it goes whole, psrv/client/roundtrip.py; its copy
of the weights out of the shard's memory, psrv/transport/shm.py), the shard's by running the same calls on a
Shard of the same config in this process, on the shard's one thread (all_finite and apply on the whole push,
read in place, as psrv/server/pushes/handler.py's take_whole does). "wait" is the rest of the worker's wait
for the answer: messages, hand-offs, scheduling. Each pass is also given in memcpys of the model's bytes
(torch's copy_ in this process, as colocated.py's baseline).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import psrv.client.roundtrip as roundtrip
import psrv.transport.shm as shm
from psrv.client.psclient import PSClient
from psrv.config import OptimConfig
from psrv.experiments.bench.apply import _time
from psrv.experiments.bench.colocated import _serve
from psrv.partition import ParamSpec, PartitionPlan
from psrv.process import tune_malloc
from psrv.server import validate
from psrv.server.rules import PushContext
from psrv.server.shard import Shard


class Stamps:
    """Time stamps of calls to module functions, by name, for the round trip under way; `restore()` puts the
    functions back."""

    def __init__(self):
        self.calls: dict[str, list[tuple[float, float]]] = {}
        self._wrapped: list[tuple[object, str, object]] = []

    def wrap(self, module, name: str) -> None:
        inner = getattr(module, name)
        self._wrapped.append((module, name, inner))

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.calls.setdefault(name, []).append((t0, time.perf_counter()))
        setattr(module, name, timed)

    def restore(self) -> None:
        for module, name, inner in reversed(self._wrapped):
            setattr(module, name, inner)
        self._wrapped.clear()

    def seconds(self, name: str) -> float:
        return sum(b - a for a, b in self.calls.get(name, ()))


def round_trips(size: int, repeats: int, tmp: Path, in_thread: bool = False) -> list[dict]:
    plan = PartitionPlan((ParamSpec("w", (size // 4,)),), 1)
    stamps = Stamps()
    stamps.wrap(roundtrip, "finite")
    stamps.wrap(shm, "copy")
    proc, address = _serve(tmp, in_thread)
    rows = []
    try:
        with PSClient([address], plan, worker=0, world_size=1, timeout=120, shared_memory=True) as client:
            client.hello()
            weights = torch.zeros(plan.total)
            grad = client.share(torch.full((plan.total,), 1e-3))
            client.init(weights)
            client.pull(clock=0, out=weights)
            for step in range(repeats + 2):
                stamps.calls.clear()
                t0 = time.perf_counter()
                client.push_pull(grad, clock=step, out=weights)
                total = time.perf_counter() - t0
                if step >= 2:  # the first ones map the memfds and fault their pages in
                    rows.append({"total": total, "worker_sum": stamps.seconds("finite"),
                                 "worker_copy": stamps.seconds("copy")})
            client.leave()
    finally:
        stamps.restore()
        proc.wait(20)
    return rows


def shard_passes(size: int, repeats: int) -> dict[str, float]:
    """The shard's passes over one whole push, on one thread as the bench's shard runs (OMP_NUM_THREADS=1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n = size // 4
        shard = Shard(n, OptimConfig(name="sgd", lr=1e-9, momentum=0.0))
        shard.init(torch.zeros(n))
        grad = torch.full((n,), 1e-3)
        ctx = PushContext(0, 0, 0, 0)
        return {"shard_sum": statistics.median(_time(lambda: validate.all_finite(grad), repeats)),
                "shard_sgd": statistics.median(_time(lambda: shard.apply(grad, ctx), repeats))}
    finally:
        torch.set_num_threads(threads)


def memcpy_seconds(size: int, repeats: int) -> float:
    src, dst = torch.ones(size // 4), torch.empty(size // 4)
    return statistics.median(_time(lambda: dst.copy_(src), repeats))


def run(size_mb: int, repeats: int, in_thread: bool = False) -> dict:
    """With `in_thread` (the test's), the shard is served from a thread of this process."""
    tune_malloc()
    size = size_mb << 20
    with tempfile.TemporaryDirectory(prefix="psrv-colocated-profile-") as d:
        rows = round_trips(size, repeats, Path(d), in_thread)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    shard = shard_passes(size, repeats)
    med["wait"] = med["total"] - med["worker_sum"] - med["worker_copy"]
    med["wait_less_shard"] = med["wait"] - shard["shard_sum"] - shard["shard_sgd"]
    return {"size_mb": size_mb, "repeats": repeats, "memcpy": memcpy_seconds(size, repeats), **med, **shard}


PASSES = (  # key, where, MB read and written per MB of the model, what
    ("worker_sum", "worker", 1, 0,
     "finiteness sum before cutting a push into chunks (psrv/codecs/push.py finite): a push read in place "
     "goes whole, so none should run"),
    ("shard_sum", "shard", 1, 0,
     "finiteness sum of the push, read in place in the worker's memfd (validate.all_finite)"),
    ("shard_sgd", "shard", 2, 1,
     "SGD step of the push: gradient and weights read, weights written (torch's fused sgd)"),
    ("worker_copy", "worker", 1, 1,
     "the weights copied out of the shard's memfd into the worker's buffer: the one copy"),
)


def table(r: dict) -> str:
    mb, copy = r["size_mb"], r["memcpy"]
    lines = [f"{mb} MB PUSH_PULL from the shared gradient, whole, medians of {r['repeats']}; "
             f"memcpy {copy * 1e3:.2f} ms",
             "| pass | where | MB read | MB written | ms | memcpys |", "|---|---|---|---|---|---|"]
    for key, where, read, written, what in PASSES:
        ran = r[key] > 0  # a pass that did not run moved no bytes
        lines.append(f"| {what} | {where} | {read * mb * ran} | {written * mb * ran} | {r[key] * 1e3:.2f} "
                     f"| {r[key] / copy:.2f} |")
    rest = r["wait_less_shard"]
    lines.append(f"| the rest of the wait: messages, hand-offs, scheduling | both | | | {rest * 1e3:.2f} "
                 f"| {rest / copy:.2f} |")
    lines.append(f"| **the round trip** | | | | **{r['total'] * 1e3:.2f}** | **{r['total'] / copy:.2f}** "
                 f"(ratio {2 * copy / r['total']:.2f}x) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=64, help="the model's size in MB (default 64)")
    p.add_argument("--repeats", type=int, default=30, help="round trips timed, after 2 not counted (default 30)")
    a = p.parse_args(argv)
    print(table(run(a.size_mb, a.repeats)))


if __name__ == "__main__":
    main()
