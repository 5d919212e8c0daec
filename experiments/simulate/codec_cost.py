"""The codecs' CPU time at the simulator's timing level (`simulate.codec_cost`, docs/simulator.md): what a
worker and a shard spend encoding and decoding one message, charged on the process that does it
(experiments/simulate/cluster.py).

"measured" (the default): each operation is the real code a run executes, timed on vectors of the shard's
actual size on this machine (experiments/simulate/codec_timing.py), once per setting and plan in a process,
so the model follows the codecs as they change, as wire.py's bytes do. "off": no cost, the prediction from
bytes alone. Importing this module imports no torch (the simulator's core does not need it)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

MODES = ("measured", "off")
_CACHE: dict[tuple, "CodecCost"] = {}


@dataclass(frozen=True)
class CodecCost:
    """Seconds of CPU per message, one entry per shard."""

    worker_push: tuple[float, ...]   # a worker's encode of its push to the shard
    worker_pull: tuple[float, ...]   # its decode of the shard's reply (compressed pulls)
    shard_push: tuple[float, ...]    # the shard's decode of one push
    shard_pull: tuple[float, ...]    # the shard's encode of one reply (compressed pulls), per worker
    load_average: float | None = field(default=None, compare=False)  # the machine's (1 min) when measured

    @classmethod
    def none(cls, shards: int) -> "CodecCost":
        zero = (0.0,) * shards
        return cls(zero, zero, zero, zero)

    def as_ms(self) -> dict[str, list[float]]:
        """The costs in ms per shard, as the result files and the printed summary give them."""
        return {k: [1000 * v for v in getattr(self, k)]
                for k in ("worker_push", "worker_pull", "shard_push", "shard_pull")}


def codec_cost(mode: str, worker, plan, *, seed: int = 0) -> CodecCost:
    """The codec cost of a worker with settings `worker` (psrv/config's WorkerSettings) on `plan` (a
    PartitionPlan); 'off': none. Measured once per setting, plan and seed in a process."""
    if mode not in MODES:
        raise ValueError(f"codec_cost must be one of {', '.join(MODES)}; got {mode!r}")
    if mode == "off" or _dense(worker):  # nothing to time: no torch import, no vector of the model's size
        return CodecCost.none(plan.num_shards)
    key = (_settings(worker), tuple(plan.ranges), seed)
    if key not in _CACHE:
        if worker.fragments > 1 or worker.outer_dtype != "float32":  # streaming DiLoCo, as wire.py tells it
            from psrv.experiments.simulate.codec_timing_streaming import measure_streaming as measure
        else:
            from psrv.experiments.simulate.codec_timing import measure
        _CACHE[key] = CodecCost(*measure(worker, plan, seed=seed), load_average=os.getloadavg()[0])
    return _CACHE[key]


def _dense(worker) -> bool:
    """Float32 both ways, no codec, no cast, no streaming: a setting whose messages no codec touches."""
    return (not worker.compress and not worker.compress_pull and worker.wire_dtype == "float32"
            and worker.fragments == 1 and worker.outer_dtype == "float32")


def _settings(worker) -> tuple:
    return (worker.compress, worker.compress_min_numel, worker.wire_dtype, worker.compress_pull,
            worker.pull_error_feedback, worker.pull_resync, worker.fragments, worker.outer_dtype)


def format_codec_cost(mode: str, ms: dict[str, list[float]], load_average: float | None = None) -> str:
    """One line of what the codecs were charged (as_ms's dict), ms per message, summed over the shards, and the
    load the machine had while they were timed (docs/simulator.md)."""
    if mode == "off":
        return "codec cost: off (bytes alone)"
    total = {k: sum(v) for k, v in ms.items()}
    load = "" if load_average is None else f" (timed at load average {load_average:.2f} on {os.cpu_count()} cores)"
    return (f"codec cost ({mode}), ms per message, all shards: worker encodes its push {total['worker_push']:.3g}, "
            f"decodes a reply {total['worker_pull']:.3g}; shard decodes a push {total['shard_push']:.3g}, "
            f"encodes a reply {total['shard_pull']:.3g}{load}")
