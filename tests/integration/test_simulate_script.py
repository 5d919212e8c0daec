"""`psrv simulate --against` of a script's run: the model is the script's own, read from its records
(param_shapes, steps, batch size), never the default job its config.json also names. A real `psrv run
--script`, then the simulator in this process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from psrv.cli import main
from psrv.experiments.harness.collect import read_csv
from psrv.experiments.simulate.against import steady_rate
from tests.helpers import psrv_run

SCRIPT = """\
import os
import torch
import psrv
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
with psrv.Worker(model) as ps:
    while ps.steps < 30:
        x = torch.randn(24, 8)
        loss = torch.nn.functional.mse_loss(model(x), x.mean(1, keepdim=True))
        loss.backward()
        ps.step(loss=loss, batch_size=len(x))
"""
PARAMETERS = 8 * 16 + 16 + 16 + 1


@pytest.mark.timeout(180)
def test_a_scripts_run_is_simulated_from_its_own_records(tmp_path: Path, capsys) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    run = tmp_path / "run"
    psrv_run(run, "--mode", "async", "--servers", "2", "--workers", "2", "--lr", "0.01", "--script", str(tmp_path / "train.py"),
             timeout=120)
    real = json.loads((run / "summary.json").read_text())
    assert real["parameters"] == PARAMETERS
    sim = tmp_path / "sim"
    assert main(["simulate", "--against", str(run), "--out", str(sim)]) == 0
    assert "steady samples/s: real" in capsys.readouterr().out
    got = json.loads((sim / "summary.json").read_text())
    assert (got["job"], got["parameters"], got["steps"], got["batch_size"]) == \
        (str(tmp_path / "train.py"), PARAMETERS, 30, 24)  # digits_mlp has 4810 parameters and batch 32
    assert len(got["message_bytes"]) == 2 and got["pushes"] == 60
    stored = json.loads((sim / "config.json").read_text())
    assert stored["job"]["script"] == str(tmp_path / "train.py")  # what was simulated, said in its config
    result = json.loads((sim / "against.json").read_text())["steady_samples_per_second"]
    assert result["real"] == steady_rate(read_csv(run / "steps.csv")) and result["simulated"] > 0
