"""The network model: every message takes latency + bytes / bandwidth on each link it crosses.

A worker's link carries its own messages one after another; a server's link carries the messages of
all its workers, first come first served, so N workers pushing at once queue there. A message to or
from shard s is that shard's range of the job's real partition plan (psrv/partition.py), in float32."""
from __future__ import annotations

from dataclasses import dataclass

from psrv.partition import PartitionPlan
from psrv.config.sections import SimulateSettings

HEADER_BYTES = 64  # a message's msgpack header, about (psrv/protocol)


@dataclass(frozen=True)
class NetworkModel:
    latency: float                 # seconds, one way
    shard_bytes: tuple[int, ...]   # one push (and one reply) to each shard
    bandwidth: float               # bytes per second, every link

    @classmethod
    def of(cls, sim: SimulateSettings, plan: PartitionPlan) -> "NetworkModel":
        sizes = tuple(4 * (hi - lo) + HEADER_BYTES for lo, hi in plan.ranges)
        return cls(latency=sim.latency_ms / 1000.0, shard_bytes=sizes, bandwidth=sim.bandwidth_gbps * 1e9 / 8)

    @property
    def transfer(self) -> tuple[float, ...]:
        """Seconds one shard's message occupies a link."""
        return tuple(b / self.bandwidth for b in self.shard_bytes)


def job_plan(job_name: str, *, seed: int, shards: int) -> tuple[PartitionPlan, object]:
    """The job's partition plan over `shards`, and the job (its model, data and evaluation)."""
    from psrv.workers.jobs import load_job
    job = load_job(job_name, seed=seed)
    return PartitionPlan.from_module(job.model, shards), job
