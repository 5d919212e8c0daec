"""Per-shard counters: what STATS answers and what `psrv serve --out` writes at exit."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass
class ShardStats:
    pushes: int = 0
    pulls: int = 0
    updates_applied: int = 0
    dropped: collections.Counter = field(default_factory=collections.Counter)
    duplicates: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    staleness: collections.Counter = field(default_factory=collections.Counter)
    max_clock_gap: int = 0
    wait_seconds: float = 0.0
    lost_workers: list = field(default_factory=list)

    def record_staleness(self, value: int) -> None:
        self.staleness[value] += 1

    @property
    def max_staleness(self) -> int:
        return max(self.staleness, default=0)

    @property
    def mean_staleness(self) -> float:
        n = sum(self.staleness.values())
        return sum(k * v for k, v in self.staleness.items()) / n if n else 0.0

    def to_dict(self) -> dict:
        return {
            "pushes": self.pushes, "pulls": self.pulls, "updates_applied": self.updates_applied,
            "dropped": dict(self.dropped), "duplicates": self.duplicates, "errors": self.errors,
            "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness.items())},
            "max_staleness": self.max_staleness, "mean_staleness": self.mean_staleness,
            "max_clock_gap": self.max_clock_gap, "wait_seconds": self.wait_seconds,
            "lost_workers": list(self.lost_workers),
        }
