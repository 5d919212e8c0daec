"""--scheduler's choices and its one-line refusals, said before any process starts or any folder is made.
(tests/system/test_slurm.py runs the slurm scheduler on a real SLURM.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from psrv.cli import main
from psrv.experiments.launcher.schedulers import SCHEDULERS

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "specs" / "tiny.toml"


def test_help_lists_every_scheduler_and_says_it_is_not_in_the_hash(capsys):
    for command in ("run", "experiment"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--scheduler {" + ",".join(SCHEDULERS) + "}" in text and "Not part of the config hash" in text


def test_an_unknown_scheduler_is_refused_by_name(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["run", "--scheduler", "pbs", "--out", str(tmp_path / "run")])
    assert "invalid choice: 'pbs'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["run", "--steps", "1"],
    ["experiment", str(TINY)],
], ids=["run", "experiment"])
def test_slurm_without_its_commands_is_one_line_before_anything_starts(command, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without SLURM's client commands
    out = tmp_path / "out"
    assert main([*command, "--scheduler", "slurm", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"psrv {command[0]}: error: --scheduler slurm: salloc, srun"), err
    assert "not found on PATH" in err and not out.exists()


def test_slurm_refuses_what_only_runs_on_this_machine(capsys, tmp_path):
    assert main(["run", "--scheduler", "slurm", "--metrics", "--out", str(tmp_path / "m")]) == 2
    assert "--scheduler slurm: --metrics writes targets.json for 127.0.0.1" in capsys.readouterr().err
    assert main(["run", "--scheduler", "slurm", "--bandwidth", "100mbit", "--out", str(tmp_path / "b")]) == 2
    assert "--scheduler slurm: network.bandwidth 100mbit emulates hosts" in capsys.readouterr().err
