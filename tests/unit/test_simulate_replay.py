"""`--compute steps.csv`: each rank the real run had replays its own steps in order, so a stall the machine put
on every rank at once (a 0.49 s one in a 30-step calibration run, both workers at the same step) stays at that step
on each; a rank the run did not have, or a run longer than it, draws from all of its steps. Drawn independently,
that stall was left out of one rank's draws and the simulated throughput was 2.2 times the real one."""
from __future__ import annotations

import csv
import json

import pytest

from psrv.config import FaultConfig
from psrv.config.sections import SimulateSettings
from psrv.experiments.simulate.compute import ComputeModel

STEPS = 6
STALL = 2  # the step both ranks lost 0.49 s on


def _real_run(folder, *, straggler: str = "") -> None:
    """A real run's steps.csv and config.json: rank r's step k computes 10 + r + k ms, and both stall at STALL."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"seed": 0, "faults": {"straggler": straggler}}))
    with open(folder / "steps.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["wall_time", "worker", "step", "compute_seconds", "communication_seconds", "wait_seconds"])
        for rank in (0, 1):
            wall = 0.0
            for step in range(STEPS):
                compute = (10 + rank + step) / 1000 + (0.49 if step == STALL else 0.0)
                wall += compute
                out.writerow([wall, rank, step, compute, 0.0, 0.0])


def _model(folder, faults: FaultConfig | None = None) -> ComputeModel:
    sim = SimulateSettings(compute="steps.csv", compute_csv=str(folder / "steps.csv"))
    return ComputeModel(sim, faults or FaultConfig(), seed=0)


def test_each_rank_of_the_real_run_replays_its_own_steps_with_the_stall_where_it_was(tmp_path):
    _real_run(tmp_path)
    model = _model(tmp_path)
    for rank in (0, 1):
        got = model.times(rank, STEPS)
        assert got == pytest.approx([(10 + rank + k) / 1000 + (0.49 if k == STALL else 0.0) for k in range(STEPS)])
    assert model.times(0, 3) == pytest.approx([0.010, 0.011, 0.502])  # a shorter run: its first steps


def test_a_rank_or_a_step_the_real_run_did_not_have_draws_from_all_of_its_steps(tmp_path):
    _real_run(tmp_path)
    model = _model(tmp_path)
    pool = {round(s, 6) for rank in (0, 1) for s in model.times(rank, STEPS)}
    for rank, steps in ((2, STEPS), (0, 4 * STEPS)):
        got = [round(s, 6) for s in model.times(rank, steps)]
        assert set(got) <= pool and got != sorted(got)  # drawn, not replayed in order
    assert model.times(2, STEPS) == model.times(2, STEPS)  # seeded


def test_a_replayed_rank_is_slowed_again_by_its_own_straggler(tmp_path):
    _real_run(tmp_path, straggler="1:3")  # rank 1's steps were 3x slower: taken out, then put back
    faults = FaultConfig(straggler="1:3")
    model = _model(tmp_path, faults)
    assert model.times(1, STEPS) == pytest.approx([(11 + k) / 1000 + (0.49 if k == STALL else 0.0)
                                                   for k in range(STEPS)])
    assert model.times(0, STEPS) == pytest.approx([(10 + k) / 1000 + (0.49 if k == STALL else 0.0)
                                                   for k in range(STEPS)])
