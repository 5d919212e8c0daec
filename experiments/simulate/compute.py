"""Compute time of every simulated step: a distribution, disturbed by psrv's own fault injector.

The undisturbed time is constant (model_ms + compute_ms), lognormal around it, or drawn from a real
run's steps.csv; stragglers then slow a step exactly as workers/faults.py slows a real worker's, with the
same seeded draws per (seed, rank, step), so a simulated run meets the disturbance a real one met."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from psrv.config.sections import SimulateSettings
from psrv.config import FaultConfig
from workers.faults import FaultInjector


def read_compute_seconds(path: str | Path) -> np.ndarray:
    """The compute_seconds column of a real run's steps.csv; ValueError if it has none."""
    with open(path, newline="") as f:
        values = [float(row["compute_seconds"]) for row in csv.DictReader(f) if row.get("compute_seconds")]
    if not values:
        raise ValueError(f"{path}: no compute_seconds in it (a steps.csv written by psrv run?)")
    return np.asarray(values)


class ComputeModel:
    def __init__(self, sim: SimulateSettings, faults: FaultConfig, *, seed: int):
        self.sim, self.faults, self.seed = sim, faults, seed
        self.base = (sim.model_ms + faults.compute_ms) / 1000.0
        self.measured = read_compute_seconds(sim.compute_csv) if sim.compute == "steps.csv" else None

    def times(self, rank: int, steps: int) -> list[float]:
        """Seconds of compute of `rank`'s steps 0..steps-1."""
        rng = np.random.default_rng([self.seed, rank])
        if self.sim.compute == "steps.csv":
            seconds = rng.choice(self.measured, size=steps)
        elif self.sim.compute == "lognormal":
            seconds = self.base * np.exp(self.sim.sigma * rng.standard_normal(steps))
        else:
            seconds = np.full(steps, self.base)
        injector = FaultInjector(self.faults, rank=rank, seed=self.seed)
        if injector.transient is not None:  # the real worker's draw for each step
            seconds = seconds * np.fromiter((injector.slowdown(s) for s in range(steps)), float, steps)
        elif injector.persistent != 1.0:
            seconds = seconds * injector.persistent
        return seconds.tolist()
