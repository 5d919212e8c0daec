"""Seeded straggler, compute and network-delay emulation, so every variant meets the same disturbance.

All draws depend only on (seed, rank, step): two runs of the same spec are disturbed identically.
"""
from __future__ import annotations

import random
import time

from psrv.config import FaultConfig


class FaultInjector:
    def __init__(self, cfg: FaultConfig, *, rank: int, seed: int):
        self.cfg = cfg
        self.rank = rank
        self.seed = seed
        pair = cfg.straggler_pair()
        self.persistent = pair[1] if pair and pair[0] == rank else 1.0
        self.transient = cfg.transient_pair()

    @property
    def active(self) -> bool:
        """Whether any disturbance is configured."""
        return self.cfg != FaultConfig()

    def slowdown(self, step: int) -> float:
        """How many times slower than normal this rank's `step` runs."""
        factor = self.persistent
        if self.transient is not None:
            p, f = self.transient
            if random.Random(f"{self.seed}:{self.rank}:{step}").random() < p:
                factor *= f
        return factor

    def extra_compute_seconds(self, step: int, measured: float) -> float:
        """Sleep to add after a step whose real compute took `measured` seconds."""
        emulated = self.cfg.compute_ms / 1000.0
        return emulated + (self.slowdown(step) - 1.0) * (measured + emulated)

    def compute(self, step: int, measured: float) -> None:
        extra = self.extra_compute_seconds(step, measured)
        if extra > 0:
            time.sleep(extra)

    def before_send(self) -> None:
        if self.cfg.net_delay_ms > 0:
            time.sleep(self.cfg.net_delay_ms / 1000.0)
