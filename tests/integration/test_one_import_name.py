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


def test_the_wheel_lists_every_package_of_the_tree():
    """pyproject.toml names psrv's packages one by one (a package-dir mapping needs it): a new folder
    with an __init__.py that is not listed would be missing from the wheel, and only there."""
    import tomllib
    root = Path(__file__).resolve().parents[2]
    settings = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"psrv": "psrv", **settings["package-dir"]}
    tree = set()
    for name, folder in folders.items():
        for init in (root / folder).rglob("__init__.py"):
            tree.add(".".join([name, *init.parent.relative_to(root / folder).parts]))
    assert set(settings["packages"]) == tree, (set(settings["packages"]) ^ tree)
