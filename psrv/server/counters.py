"""Per-shard counters: what STATS answers, what `psrv serve --out` writes, and what /metrics shows.

Every event is recorded once, here; when Prometheus metrics are on, the same call updates them.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ShardStats:
    metrics: Any = None  # psrv.metrics.ServerMetrics, or None
    pushes: int = 0
    pulls: int = 0
    updates_applied: int = 0
    pushes_applied: int = 0     # pushes whose gradient went into an update (sync: into its clock's mean)
    partially_applied: int = 0  # chunked pushes given up half applied (dropped, yet they moved the weights)
    chunked_pushes: int = 0     # pushes that came in chunks (psrv/server/pushes/chunked.py), counted at their first
    dropped: collections.Counter = field(default_factory=collections.Counter)
    duplicates: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    staleness: collections.Counter = field(default_factory=collections.Counter)
    max_clock_gap: int = 0
    wait_seconds: float = 0.0
    lost_workers: list = field(default_factory=list)
    lr_scale: collections.Counter = field(default_factory=collections.Counter)  # per applied update

    # --- events -------------------------------------------------------------
    def received(self, nbytes: int) -> None:
        self.bytes_in += nbytes
        if self.metrics:
            self.metrics.bytes_received.inc(nbytes)

    def sent(self, nbytes: int) -> None:
        self.bytes_out += nbytes
        if self.metrics:
            self.metrics.bytes_sent.inc(nbytes)

    def pushed(self, seconds: float, staleness: int | None) -> None:
        """A push was received and settled (applied, buffered, or dropped: counted once, re-sends
        not); `seconds` to handle it."""
        self.pushes += 1
        if staleness is not None:
            self.staleness[staleness] += 1
        if self.metrics:
            self.metrics.pushes.inc()
            self.metrics.push_latency.observe(seconds)
            if staleness is not None:
                self.metrics.push_staleness.observe(staleness)

    def applied(self, version: int, *, lr_scale: float = 1.0, pushes: int = 1) -> None:
        """An optimizer step was taken with `pushes` gradients (sync: the clock's; else one); `lr_scale`:
        the factor the update rule scaled its gradient by."""
        self.updates_applied += 1
        self.pushes_applied += pushes
        self.lr_scale[round(lr_scale, 6)] += 1
        if self.metrics:
            self.metrics.updates_applied.inc()
            self.metrics.lr_scale.observe(lr_scale)
            self.metrics.shard_version.set(version)

    def drop(self, reason: str, count: int = 1) -> None:
        """`count` gradients received and never applied whole: "late" (their clock was finished without
        them), "invalid" (NaN/Inf) or "partial" (a chunked push its worker gave up half-way)."""
        if count:
            self.dropped[reason] += count
            if self.metrics:
                self.metrics.dropped(reason).inc(count)

    def chunked(self) -> None:
        """A push began to arrive in chunks."""
        self.chunked_pushes += 1

    def partial(self) -> None:
        """A dropped chunked push had chunks applied: the shard's version counts that step."""
        self.partially_applied += 1

    def duplicate(self) -> None:
        """A re-sent push, answered from the dedup table and not applied again."""
        self.duplicates += 1
        if self.metrics:
            self.metrics.dropped("duplicate").inc()

    def answered(self, *, waited: float, gap: int) -> None:
        """A pull was answered after `waited` seconds, at clock gap `gap`."""
        self.pulls += 1
        self.wait_seconds += waited
        self.max_clock_gap = max(self.max_clock_gap, gap)
        if self.metrics:
            self.metrics.pulls.inc()
            self.metrics.pull_latency.observe(waited)
            self.metrics.wait_seconds.inc(waited)
            self.metrics.max_clock_gap.set(self.max_clock_gap)

    def membership(self, active: set[int], clocks: dict[int, int]) -> None:
        if self.metrics:
            self.metrics.active_workers.set(len(active))
            for w, c in clocks.items():
                self.metrics.worker_clock(w).set(c)

    def departed(self, worker: int) -> None:
        """`worker` left the active set (LEAVE or silence): its clock series goes until it rejoins."""
        if self.metrics:
            self.metrics.forget_worker(worker)

    # --- a backup's copy (psrv/server/replication/handler.py `replica_state`) -----------------------
    COUNTS = ("pushes", "pulls", "updates_applied", "pushes_applied", "partially_applied", "chunked_pushes",
              "duplicates", "errors", "bytes_in", "bytes_out", "max_clock_gap", "wait_seconds")

    def state_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in self.COUNTS}, "dropped": dict(self.dropped),
                "staleness": dict(self.staleness), "lost_workers": list(self.lost_workers),
                "lr_scale": {float(k): v for k, v in self.lr_scale.items()}}

    def load_state_dict(self, state: dict) -> None:
        """The counters a primary had when it sent its state: a backup's counts go on from them."""
        for k in self.COUNTS:
            setattr(self, k, type(getattr(self, k))(state.get(k, 0) if k == "chunked_pushes" else state[k]))
        self.dropped = collections.Counter(state["dropped"])
        self.staleness = collections.Counter({int(k): v for k, v in state["staleness"].items()})
        self.lost_workers = list(state["lost_workers"])
        self.lr_scale = collections.Counter({float(k): v for k, v in state["lr_scale"].items()})

    # --- summaries ----------------------------------------------------------
    @property
    def max_staleness(self) -> int:
        return max(self.staleness, default=0)

    @property
    def mean_staleness(self) -> float:
        n = sum(self.staleness.values())
        return sum(k * v for k, v in self.staleness.items()) / n if n else 0.0

    @property
    def mean_lr_scale(self) -> float:
        n = sum(self.lr_scale.values())
        return sum(k * v for k, v in self.lr_scale.items()) / n if n else 1.0

    def to_dict(self) -> dict:
        return {
            "pushes": self.pushes, "pulls": self.pulls, "updates_applied": self.updates_applied,
            "pushes_applied": self.pushes_applied, "partially_applied": self.partially_applied,
            "chunked_pushes": self.chunked_pushes, "dropped": dict(self.dropped), "duplicates": self.duplicates,
            "errors": self.errors,
            "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness.items())},
            "max_staleness": self.max_staleness, "mean_staleness": self.mean_staleness,
            "max_clock_gap": self.max_clock_gap, "wait_seconds": self.wait_seconds,
            "lost_workers": list(self.lost_workers),
            "lr_scale_histogram": {f"{k:g}": v for k, v in sorted(self.lr_scale.items(), reverse=True)},
            "mean_lr_scale": self.mean_lr_scale,
        }
