"""A psrv.Worker script under torchrun, unchanged: tests/integration/script_loop.py (user_loop.py's data and
model, a DistributedSampler, RANK and WORLD_SIZE read from the environment) as `torchrun --nproc-per-node 2`
against two `psrv serve` shards named by PSRV_SERVERS=@FILE, and as `psrv run --launcher torchrun --script`.
In sync mode both end on the weights of `psrv run --script` with the default launcher, which is single-process
SGD on the global batch (test_run_script.py), and the torchrun run's steps.csv and summary are its own.
A failing rank and Ctrl-C take the default launcher's paths through the one torchrun process."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from psrv.config import RunConfig, from_dict
from psrv.config.base import config_hash

from tests.helpers import ROOT, psrv_argv, psrv_run, run_in_session
from tests.integration.test_interrupts import _alive, _children, _reap, _wait_for_steps
from tests.integration.test_worker_api import LR, MOMENTUM, WORKERS

# these walk the launcher's process tree, its fork server in it: no zygote (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("own_fork_server")

SCRIPT = Path(__file__).with_name("script_loop.py")
STEPS, SHARDS = 12, 2
SYNC = ("--mode", "sync", "--optimizer", "sgd", "--lr", str(LR), "--momentum", str(MOMENTUM))
TIMING = {"wall_seconds", "samples_per_second", "wait_seconds", "eval_seconds"}  # measured, so they differ


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """`psrv run --script` with the default launcher: the run the others must equal."""
    tmp = tmp_path_factory.mktemp("psrv-launcher")
    out = tmp / "run"
    summary = psrv_run(out, *SYNC, "--servers", str(SHARDS), "--workers", str(WORKERS), "--steps", str(STEPS),
                       "--script", str(SCRIPT), "1", str(tmp / "final.pt"))
    return out, summary


def _counts(out: Path) -> dict[str, list[int]]:
    """steps.csv's steps, by worker."""
    with open(out / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by_worker: dict[str, list[int]] = {}
    for row in rows:
        by_worker.setdefault(row["worker"], []).append(int(row["step"]))
    return {w: sorted(steps) for w, steps in by_worker.items()}


def _torchrun(procs, tmp_path: Path, env: dict) -> subprocess.Popen:
    """`torchrun --nproc-per-node WORKERS script_loop.py 1 OUT`, as a user types it (killed by PID at teardown)."""
    from psrv.experiments.launcher.cluster import free_port
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORKERS), "--master-addr",
            "127.0.0.1", "--master-port", str(free_port()), "--log-dir", str(tmp_path / "torchrun"),
            str(SCRIPT), "1", str(tmp_path / "final.pt")]
    with open(tmp_path / "torchrun.log", "w") as log:
        p = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    p.name = "torchrun"
    procs.started.append(p)
    return p


@pytest.mark.timeout(240)
def test_a_script_under_torchrun_against_psrv_serve_ends_on_psrv_runs_sync_weights(procs, tmp_path, reference):
    ready = [tmp_path / f"server-{i}.addr" for i in range(SHARDS)]
    # torchrun first: its ranks wait for the shards' ready files (PSRV_SERVERS=@FILE,...)
    trainer = _torchrun(procs, tmp_path, {"PSRV_SERVERS": ",".join(f"@{r}" for r in ready),
                                          "PSRV_STEPS": str(STEPS)})
    servers = [procs.start(f"server-{i}", "serve", "--bind", "tcp://127.0.0.1:0", "--ready-file", str(ready[i]),
                           "--shard", str(i), "--num-shards", str(SHARDS), "--workers", str(WORKERS), *SYNC,
                           "--worker-timeout", "60") for i in range(SHARDS)]
    assert procs.wait(trainer, timeout=180) == 0, procs.log("torchrun")[-3000:]
    for server in servers:
        assert procs.wait(server, timeout=30) == 0, procs.log(server.name)[-3000:]  # every worker left
    ran, summary = reference
    want = torch.load(ran / "params.pt")
    saved = torch.load(ran.parent / "final.pt")  # the reference script's own save: the same weights
    torch.testing.assert_close(saved, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.load(tmp_path / "final.pt"), want, rtol=0, atol=1e-5)
    for rank in range(WORKERS):  # each rank drew the reference rank's batches and saw the same weights
        mine = json.loads((tmp_path / f"final.pt.losses-{rank}.json").read_text())
        theirs = json.loads((ran.parent / f"final.pt.losses-{rank}.json").read_text())
        assert len(mine) == STEPS
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), rtol=0, atol=1e-5)


@pytest.mark.timeout(240)
def test_psrv_run_with_the_torchrun_launcher_is_the_same_run_and_says_its_launcher(tmp_path, reference):
    ran, want = reference
    out = tmp_path / "run"
    got = psrv_run(out, *SYNC, "--servers", str(SHARDS), "--workers", str(WORKERS), "--steps", str(STEPS),
                   "--launcher", "torchrun", "--script", str(SCRIPT), "1", str(tmp_path / "final.pt"))
    assert (got["launcher"], want["launcher"]) == ("torchrun", "psrv")
    mine, theirs = (json.loads((d / "config.json").read_text()) for d in (out, ran))
    assert mine["job"]["script_args"] != theirs["job"]["script_args"]      # each run's own final.pt path
    theirs["job"]["script_args"] = mine["job"]["script_args"]
    assert mine == theirs                                                   # the launcher is not the config
    assert got["config_hash"] == config_hash(from_dict(RunConfig, theirs)) != want["config_hash"]
    same = set(want) - TIMING - {"launcher", "script_args", "config_hash"}
    assert {k: got[k] for k in same} == {k: want[k] for k in same}
    assert got["pushes"] == WORKERS * STEPS and got["updates_applied"] == STEPS
    assert _counts(out) == _counts(ran) == {str(r): list(range(STEPS)) for r in range(WORKERS)}
    assert [int((out / f"worker-{r}.progress").read_text()) for r in range(WORKERS)] == [STEPS] * WORKERS
    torch.testing.assert_close(torch.load(out / "params.pt"), torch.load(ran / "params.pt"), rtol=0, atol=1e-5)


@pytest.mark.timeout(180)
def test_a_rank_that_fails_under_torchrun_fails_the_run_in_one_line_naming_it(tmp_path):
    out = tmp_path / "run"
    proc = run_in_session(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--mode", "sync",
                                    "--servers", "1", "--out", str(out), "--launcher", "torchrun", "--script",
                                    str(SCRIPT), "1", str(tmp_path / "final.pt"), "0"), timeout=150)
    assert proc.returncode == 1, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if "psrv run" in line]
    assert lines == [f"psrv run failed: rank 1 ({SCRIPT}, under torchrun) exited with code 1 (RuntimeError: "
                     f"rank 1 fails at step 0, as asked); its output: {out / 'workers.log'} (lines [worker1]:)"], \
        proc.stdout
    assert "[worker1]:Traceback" in (out / "workers.log").read_text()           # the script's output is there


@pytest.mark.timeout(240)
def test_ctrl_c_reaches_every_rank_through_torchrun_and_what_ran_is_written(tmp_path):
    out = tmp_path / "run"
    with open(tmp_path / "stderr", "w") as stderr:
        launcher = subprocess.Popen(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--mode", "async",
                                              "--servers", "1", "--out", str(out), "--launcher", "torchrun",
                                              "--script", str(SCRIPT), "400", str(tmp_path / "final.pt")),
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
    family: dict[int, str] = {}
    try:
        for rank in range(WORKERS):  # async: rank 0 (which sends the initial weights) may start later
            _wait_for_steps(out / f"worker-{rank}.progress", 20, launcher, tmp_path / "stderr")
        family = _children(launcher.pid)                           # the shard and torchrun
        family.update({pid: t for parent in list(family) for pid, t in _children(parent).items()})  # its ranks
        assert len(family) == 2 + WORKERS, family
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(60) == 130
        time.sleep(0.5)
        assert [pid for pid, started in family.items() if _alive(pid, started)] == []
    finally:
        _reap(launcher, family)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["launcher"] == "torchrun"
    with open(out / "steps.csv", newline="") as f:
        assert summary["steps_done"] == len(list(csv.DictReader(f))) >= 2 * 20
    for rank in range(WORKERS):                                    # each rank left and wrote what it did
        assert json.loads((out / f"worker-{rank}.json").read_text())["interrupted"] is True
    assert summary["lost_workers"] == []
