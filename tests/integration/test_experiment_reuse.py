"""`psrv experiment` knows what its runs are: a changed spec reruns them (the old runs kept aside) and the
report shows what was run; an unchanged spec reuses them, and a spec changed back puts the kept run
back; a copied spec never writes into another spec
file's folder. Real CLI, real processes on 127.0.0.1, run from a temporary folder (the default output,
runs/<spec file stem>, is relative to it). Both tests start from the same first run of tiny.toml, made
once and copied (it records its spec's path relative to its folder, so the copy is a folder of its own).
Each run has one shard and one worker: these tests are about which runs are reused, not the cluster
(test_experiment runs 2 workers), and each process imports torch."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psrv.config import RunConfig, from_dict
from psrv.config.base import config_hash

SPEC = """
name = "tiny"
seeds = [0]

[job]
name = "digits_mlp"
steps = 8
batch_size = 32
eval_every = 4

[optimizer]
name = "sgd"
lr = {lr}

[cluster]
servers = 1
workers = 1

[target]
eval_accuracy = 0.2

[[variants]]
mode = "sync"
"""


def experiment(cwd: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`psrv experiment ARGS` in `cwd`, in its own process group, killed whole at the time limit."""
    p = subprocess.Popen([sys.executable, "-m", "psrv.cli", "experiment", *args], cwd=cwd, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"psrv experiment {args} still running after {timeout}s:\n{out[-3000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, "")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`psrv experiment tiny.toml` (lr 0.05) run once, in a folder of its own: (that folder, what it said)."""
    root = tmp_path_factory.mktemp("first_run")
    (root / "tiny.toml").write_text(SPEC.format(lr=0.05))
    return root, experiment(root, "tiny.toml", timeout=120)


def start_from(first_run, tmp_path: Path) -> subprocess.CompletedProcess:
    """The first run's folder (spec and runs/) copied into tmp_path; what that first run said."""
    root, first = first_run
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    return first


def stored(run: Path) -> tuple[RunConfig, str]:
    """A run's stored config and the hash its summary.json recorded."""
    cfg = from_dict(RunConfig, json.loads((run / "config.json").read_text()))
    return cfg, json.loads((run / "summary.json").read_text())["config_hash"]


@pytest.mark.timeout(300)
def test_a_changed_spec_reruns_and_the_report_shows_what_ran(first_run, tmp_path):
    # stays slow (three `psrv experiment` processes): a rerun, a reuse and a restore are each the command's own
    first = start_from(first_run, tmp_path)  # tiny.toml with lr 0.05, run once
    spec = tmp_path / "tiny.toml"
    run = tmp_path / "runs" / "tiny" / "sync" / "rep-0"
    assert first.returncode == 0, first.stdout[-4000:]
    assert "report: runs/tiny/report.md" in first.stdout  # the default folder: runs/<spec file stem>
    old_cfg, old_hash = stored(run)
    assert old_cfg.optimizer.lr == 0.05 and old_hash == config_hash(old_cfg)

    spec.write_text(SPEC.format(lr=0.5))
    second = experiment(tmp_path, "tiny.toml", timeout=120)
    assert second.returncode == 0, second.stdout[-4000:]
    kept = f"runs/tiny/sync/rep-0.replaced-{old_hash}"
    assert (f"rerunning sync rep-0: its config changed (optimizer.lr 0.05 -> 0.5); the old run is kept in "
            f"{kept}") in second.stdout
    assert stored(tmp_path / kept)[0].optimizer.lr == 0.05  # kept aside whole, as it was
    new_cfg, new_hash = stored(run)
    assert new_cfg.optimizer.lr == 0.5 and new_hash == config_hash(new_cfg) != old_hash
    report = (tmp_path / "runs" / "tiny" / "report.md").read_text()
    assert "- Optimizer: sgd, lr 0.5, momentum 0.9" in report and "--lr 0.5 " in report
    assert "lr 0.05" not in report and "--lr 0.05" not in report and "The runs disagree" not in report
    assert "all finished runs (1) are the spec's" in report
    runs_csv = (tmp_path / "runs" / "tiny" / "runs.csv").read_text().splitlines()
    assert len(runs_csv) == 2 and runs_csv[1].endswith(new_hash)  # the kept-aside run is not collected

    before = (run / "summary.json").stat().st_mtime_ns
    t0 = time.monotonic()
    third = experiment(tmp_path, "tiny.toml", timeout=90)
    assert third.returncode == 0, third.stdout[-4000:]
    assert "skipped sync rep-0 (seed 0): already finished with this config" in third.stdout
    assert "rerunning" not in third.stdout
    assert not [line for line in third.stdout.splitlines() if line.startswith("finished ")]
    assert (run / "summary.json").stat().st_mtime_ns == before, "an unchanged run was run again"
    assert sorted(p.name for p in run.parent.iterdir()) == ["evals.csv", "rep-0", f"rep-0.replaced-{old_hash}",
                                                          "steps.csv"]
    assert time.monotonic() - t0 < 60

    spec.write_text(SPEC.format(lr=0.05))  # back to the first config: the run kept aside is put back
    fourth = experiment(tmp_path, "tiny.toml", timeout=90)
    assert fourth.returncode == 0, fourth.stdout[-4000:]
    assert (f"restored sync rep-0 (seed 0) from runs/tiny/sync/rep-0.replaced-{old_hash}: it ran with this "
            f"config before; the run it replaces is kept in runs/tiny/sync/rep-0.replaced-{new_hash}") in fourth.stdout
    assert not [line for line in fourth.stdout.splitlines() if line.startswith("finished ")]
    assert stored(run) == (old_cfg, old_hash) and stored(run.with_name(f"rep-0.replaced-{new_hash}"))[1] == new_hash
    assert "- Optimizer: sgd, lr 0.05, momentum 0.9" in (tmp_path / "runs" / "tiny" / "report.md").read_text()


@pytest.mark.timeout(300)
def test_a_copied_spec_never_writes_into_the_originals_folder(first_run, tmp_path):
    # stays slow (three `psrv experiment` processes): the copy's run, the refusal and the chosen --out each its own
    first = start_from(first_run, tmp_path)  # tiny.toml with lr 0.05, run once
    original = (tmp_path / "tiny.toml").resolve()
    assert first.returncode == 0, first.stdout[-4000:]
    runs = tmp_path / "runs"
    mine = {p: p.stat().st_mtime_ns for p in (runs / "tiny").rglob("*")}

    copy = tmp_path / "copy.toml"  # the same name = "tiny" inside, another file
    copy.write_text(original.read_text())
    second = experiment(tmp_path, "copy.toml", timeout=120)
    assert second.returncode == 0, second.stdout[-4000:]
    assert "report: runs/copy/report.md" in second.stdout
    assert (runs / "copy" / "sync" / "rep-0" / "summary.json").exists()
    assert {p: p.stat().st_mtime_ns for p in (runs / "tiny").rglob("*")} == mine, "the copy wrote into runs/tiny"

    # a spec file of the same stem elsewhere: its default folder is runs/tiny, which is another file's
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "tiny.toml").write_text(original.read_text())
    t0 = time.monotonic()
    refused = experiment(tmp_path, "other/tiny.toml", timeout=60)
    assert refused.returncode == 2, refused.stdout[-4000:]
    [line] = refused.stdout.strip().splitlines()
    assert line == (f"psrv experiment: error: runs/tiny holds the results of {original}, not of "
                    "other/tiny.toml; pass --out DIR to write this spec's results into another folder")
    assert {p: p.stat().st_mtime_ns for p in (runs / "tiny").rglob("*")} == mine
    assert time.monotonic() - t0 < 30

    # an explicit --out is the user's choice: it goes on, says the folder mixes specs, and reuses the run
    # only because its config is the very same
    chosen = experiment(tmp_path, "other/tiny.toml", "--out", "runs/tiny", timeout=90)
    assert chosen.returncode == 0, chosen.stdout[-4000:]
    assert f"note: runs/tiny also holds the results of {original}" in chosen.stdout
    assert "skipped sync rep-0 (seed 0): already finished with this config" in chosen.stdout
    assert (runs / "tiny" / "_spec-path.txt").read_text().split() == ["../../tiny.toml", "../../other/tiny.toml"]
    assert f"- Folder: **also holds the results of {original}**" in (runs / "tiny" / "report.md").read_text()
