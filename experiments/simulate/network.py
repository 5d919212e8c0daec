"""The network model: every message takes latency + bytes / bandwidth on each link it crosses.

A worker's link carries its own messages one after another; a server's link carries the messages of
all its workers, first come first served, so N workers pushing at once queue there. A push to shard s
and its reply weigh what the real system sends for that shard's range of the job's real partition plan
(psrv/partition.py): float32, or the codecs' bytes (experiments/simulate/wire.py)."""
from __future__ import annotations

from dataclasses import dataclass

from psrv.partition import PartitionPlan
from psrv.config.sections import SimulateSettings
from psrv.experiments.simulate.wire import wire_bytes

HEADER_BYTES = 64  # a message's msgpack header, about (psrv/protocol)


@dataclass(frozen=True)
class NetworkModel:
    latency: float                   # seconds, one way
    push_bytes: tuple[float, ...]    # one push to each shard
    reply_bytes: tuple[float, ...]   # and its reply
    bandwidth: float                 # bytes per second, every link

    @classmethod
    def of(cls, sim: SimulateSettings, plan: PartitionPlan, worker=None, *, seed: int = 0) -> "NetworkModel":
        """The network of `sim` for `plan`; `worker` (WorkerSettings; None: float32 both ways) sets the bytes."""
        if worker is None:
            push = reply = tuple(4.0 * (hi - lo) + HEADER_BYTES for lo, hi in plan.ranges)
        else:
            sizes = wire_bytes(worker, plan, seed=seed)
            push, reply = sizes.push, sizes.reply
        return cls(latency=sim.latency_ms / 1000.0, push_bytes=push, reply_bytes=reply,
                   bandwidth=sim.bandwidth_gbps * 1e9 / 8)

    @property
    def push_transfer(self) -> tuple[float, ...]:
        """Seconds one shard's push occupies a link."""
        return tuple(b / self.bandwidth for b in self.push_bytes)

    @property
    def reply_transfer(self) -> tuple[float, ...]:
        """Seconds one shard's reply occupies a link."""
        return tuple(b / self.bandwidth for b in self.reply_bytes)


def job_plan(job_name: str, *, seed: int, shards: int) -> tuple[PartitionPlan, object]:
    """The job's partition plan over `shards`, and the job (its model, data and evaluation)."""
    from psrv.workers.jobs import load_job
    job = load_job(job_name, seed=seed)
    return PartitionPlan.from_module(job.model, shards), job
