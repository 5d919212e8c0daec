"""Compute time of every simulated step: a distribution, disturbed by psrv's own fault injector.

The undisturbed time is constant (model_ms + compute_ms), lognormal around it, or a real run's steps (its own
stragglers taken out): a rank the real run had, for as many steps as it ran, replays its own steps in order (a stall
the machine put on every rank at once stays at the same step on each); any other draws from all of them.
Stragglers then slow a step exactly as workers/faults.py slows a real worker's, with the same seeded draws per
(seed, rank, step), so a simulated run meets the disturbance a real one met."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from psrv.config import FaultConfig, from_dict
from psrv.config.sections import SimulateSettings
from psrv.workers.faults import FaultInjector


def step_parts(rows: list[dict[str, str]], faults: FaultConfig,
               seed: int) -> dict[int, tuple[list[float], list[float]]]:
    """Per rank of a real run's steps.csv rows: each step's compute_seconds over its straggler factor (the
    fault injector's seeded draw), in step order, and the time its worker spent between the end of each step and
    the start of the next (one fewer)."""
    injectors, last, out = {}, {}, {}
    for row in sorted(rows, key=lambda r: (int(r["worker"]), int(r["step"]))):
        rank, end = int(row["worker"]), float(row["wall_time"])
        if rank not in injectors:
            injectors[rank] = FaultInjector(faults, rank=rank, seed=seed)
        compute, between = out.setdefault(rank, ([], []))
        spent = float(row["compute_seconds"]) + float(row["communication_seconds"]) + float(row["wait_seconds"])
        if rank in last:
            between.append(max(0.0, end - last[rank] - spent))
        compute.append(float(row["compute_seconds"]) / injectors[rank].slowdown(int(row["step"])))
        last[rank] = end
    return out


def undisturbed_seconds(steps_csv: str | Path) -> tuple[dict[int, np.ndarray], float]:
    """The busy time of every step of a real run, per rank in step order (compute_seconds over that step's
    straggler factor, plus the time its worker spent since its last step ended), and that run's compute_ms, from
    its steps.csv and the config.json beside it; ValueError if either is missing."""
    path = Path(steps_csv)
    try:
        stored = json.loads((path.parent / "config.json").read_text())  # its faults and seed are what matter
        faults, seed = from_dict(FaultConfig, stored.get("faults", {})), int(stored.get("seed", 0))
        with open(path, newline="") as f:
            parts = step_parts(list(csv.DictReader(f)), faults, seed)
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"--compute-csv {path}: a real run's steps.csv with its config.json beside it ({exc})") from None
    if not parts:
        raise ValueError(f"--compute-csv {path}: no steps in it")
    return {rank: np.asarray(compute) + np.asarray([0.0, *between]) for rank, (compute, between) in parts.items()}, \
        faults.compute_ms


class ComputeModel:
    def __init__(self, sim: SimulateSettings, faults: FaultConfig, *, seed: int):
        self.sim, self.faults, self.seed = sim, faults, seed
        self.base = (sim.model_ms + faults.compute_ms) / 1000.0
        self.measured, self.pool = {}, None
        if sim.compute == "steps.csv":
            self.measured, compute_ms = undisturbed_seconds(sim.compute_csv)
            self.pool = np.concatenate(list(self.measured.values()))
            if compute_ms != faults.compute_ms:
                raise ValueError(f"--compute-csv {sim.compute_csv}: that run emulated compute_ms {compute_ms}, this "
                                 f"one {faults.compute_ms}; give the same (its steps already hold it)")

    def times(self, rank: int, steps: int) -> list[float]:
        """Seconds of compute of `rank`'s steps 0..steps-1."""
        rng = np.random.default_rng([self.seed, rank])
        own = self.measured.get(rank)
        if own is not None and len(own) >= steps:  # the real run's rank: its own steps, replayed
            seconds = own[:steps].copy()
        elif self.sim.compute == "steps.csv":
            seconds = rng.choice(self.pool, size=steps)
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
