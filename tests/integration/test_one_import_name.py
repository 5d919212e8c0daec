"""psrv installs one import name, and nothing it starts can be shadowed by a user's own packages.

A researcher's project often has a `workers/` or `experiments/` package of its own. psrv's shipped loop,
all-reduce ranks and harness import as psrv.workers and psrv.experiments, and the processes psrv starts
run with -P (the current folder is not on their sys.path), so from such a folder every mode still runs
psrv's own modules. Before, `psrv run --mode ddp` there ran the user's workers/ddp.py and ended in
"expected 2 worker records in ..., found 0".

The harness's run from that folder is also test_custom_jobs' spec: the user's own job, named as a module
of the folder and as a file in it, still imports from the current folder while psrv's own packages come
from psrv (one `psrv experiment` for both, each of its runs importing torch in two processes)."""
from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

from tests.helpers import run_in_session
from tests.integration.test_custom_jobs import JOB_SOURCE, PARAMS, SPEC

PSRV = str(Path(sys.executable).with_name("psrv"))  # the command a user types


def user_folder(tmp: Path) -> Path:
    """A project with its own `workers` and `experiments` packages: importing any of their modules fails
    loudly, and a module named like one of psrv's leaves a mark if it is ever run."""
    tmp.mkdir()
    for package in ("workers", "experiments"):
        (tmp / package).mkdir()
        (tmp / package / "__init__.py").write_text(
            f"import pathlib\npathlib.Path(__file__).with_name('IMPORTED').touch()\n"
            f"raise ImportError('the user\\'s own {package} package was imported')\n")
    (tmp / "workers" / "ddp.py").write_text("raise SystemExit('the user\\'s workers/ddp.py ran')\n")
    return tmp


def test_the_wheel_installs_one_top_level_name():
    names = importlib.metadata.distribution("psrv").read_text("top_level.txt").split()
    assert names == ["psrv"], names


@pytest.mark.timeout(420)
def test_every_mode_and_the_harness_run_from_a_folder_with_its_own_workers_and_experiments(tmp_path):
    # stays slow (real processes of every kind): what it proves is what those processes import
    here = user_folder(tmp_path / "project")
    # one worker each: every kind of process psrv starts (shard, worker, DDP rank, harness) still starts
    # from this folder, and how many there are is not what is tested (each imports torch, ~1.8 s CPU)
    for mode in ("sync", "async", "ddp"):
        out = here / f"run-{mode}"
        proc = run_in_session([PSRV, "run", "--mode", mode, "--servers", "1", "--workers", "1", "--steps", "3",
                               "--no-progress", "--log-level", "WARNING", "--out", str(out)], timeout=120, cwd=here)
        assert proc.returncode == 0, f"psrv run --mode {mode}:\n{proc.stdout[-3000:]}"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["mode"] == mode and summary["steps"] == 3, summary
    # the harness, from the same folder, trains the user's own job: a module beside it and a file below it
    (here / "tinyjob.py").write_text(JOB_SOURCE)
    (here / "jobs").mkdir()
    (here / "jobs" / "tiny_file.py").write_text(JOB_SOURCE)
    (here / "spec.toml").write_text(SPEC)
    proc = run_in_session([PSRV, "experiment", "spec.toml", "--out", "exp"], timeout=280, cwd=here)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (here / "exp" / "report.md").is_file()
    for variant, job in (("module", "tinyjob:make"), ("file", "jobs/tiny_file.py:make")):
        summary = json.loads((here / "exp" / variant / "rep-0" / "summary.json").read_text())
        assert summary["job"] == job and summary["pushes"] == 4, summary
        assert summary["parameters"] == PARAMS, "trained some other model than the user's"
    assert not list(here.rglob("IMPORTED")), "a user's package was imported by a psrv process"


def test_the_wheel_holds_every_package_of_the_tree_through_the_symlinks():
    """psrv/workers and psrv/experiments are the design card's workers/ and experiments/, and setuptools' package
    discovery (pyproject.toml's packages.find) walks through them: every folder under psrv/ with an __init__.py is
    a package of the wheel, theirs included."""
    import os
    from setuptools import find_packages
    root = Path(__file__).resolve().parents[2]
    for name in ("workers", "experiments"):
        assert (root / "psrv" / name).is_symlink() and (root / "psrv" / name).resolve() == root / name
    tree = {".".join(Path(folder).relative_to(root).parts)
            for folder, _, files in os.walk(root / "psrv", followlinks=True) if "__init__.py" in files}
    assert {"psrv.workers.jobs", "psrv.experiments.launcher.nemesis"} <= tree
    assert set(find_packages(where=str(root), include=["psrv", "psrv.*"])) == tree
