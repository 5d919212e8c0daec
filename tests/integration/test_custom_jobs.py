"""A user's own job, in a module or a file in the current folder, trains wherever a shipped one does:
`psrv experiment` (a spec naming it as `mod:factory` or `path/file.py:factory`) and `psrv worker`,
both started by the console script, which (unlike `python -m`) puts no folder on the Python path.

The spec below (a job named as a module and as a file) runs in test_one_import_name, from a folder that
also holds its own `workers` and `experiments` packages: one `psrv experiment` checks both."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

PSRV = str(Path(sys.executable).with_name("psrv"))
FEATURES, CLASSES = 5, 3
PARAMS = FEATURES * CLASSES + CLASSES  # the job's one Linear layer: no shipped job has this many

JOB_SOURCE = f'''"""A tiny job a user might write: a linear model on seeded separable data."""
import torch

from psrv.workers.jobs import Job


def make(seed):
    gen = torch.Generator().manual_seed(7)
    teacher = torch.randn({FEATURES}, {CLASSES}, generator=gen)
    x, xt = torch.randn(256, {FEATURES}, generator=gen), torch.randn(64, {FEATURES}, generator=gen)
    model = torch.nn.Linear({FEATURES}, {CLASSES})
    return Job("tiny", model, (x, (x @ teacher).argmax(1)), (xt, (xt @ teacher).argmax(1)))
'''

SPEC = '''name = "custom"
[cluster]
servers = 1
workers = 1
[job]
name = "tinyjob:make"
steps = 4
batch_size = 16
[target]
eval_accuracy = 0.1
[[variants]]
name = "module"
mode = "async"
[[variants]]
name = "file"
mode = "async"
job = { name = "jobs/tiny_file.py:make" }
'''


def psrv(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """The console script in `cwd`, its own session, killed by PID if it overruns."""
    p = subprocess.Popen([PSRV, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, out, "")


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    """A folder as a user has it: tinyjob.py beside them and jobs/tiny_file.py below."""
    (tmp_path / "tinyjob.py").write_text(JOB_SOURCE)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "tiny_file.py").write_text(JOB_SOURCE)
    return tmp_path


@pytest.mark.timeout(180)
def test_psrv_worker_imports_a_job_module_from_the_current_folder(user_folder, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    refused = psrv("worker", "--servers", "tcp://127.0.0.1:9", "--job", "tinyjob:make", cwd=elsewhere, timeout=60)
    assert refused.returncode == 2 and "cannot import tinyjob" in refused.stdout, refused.stdout

    ready = user_folder / "server.addr"
    server = subprocess.Popen([PSRV, "serve", "--bind", "tcp://127.0.0.1:0", "--ready-file", str(ready),
                               "--workers", "1", "--mode", "async", "--out", str(user_folder / "server.json")],
                              cwd=elsewhere, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        started = time.monotonic()
        trained = psrv("worker", "--servers", f"@{ready}", "--job", "tinyjob:make", "--steps", "5",
                       "--batch-size", "16", "--out", "w.json", cwd=user_folder, timeout=150)
        assert trained.returncode == 0, trained.stdout[-4000:]
        record = json.loads((user_folder / "w.json").read_text())
        assert record["pushes"] == 5 and record["parameters"] == PARAMS, record
        assert server.wait(timeout=max(5.0, 160 - (time.monotonic() - started))) == 0
        assert json.loads((user_folder / "server.json").read_text())["updates_applied"] == 5
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 9)
            server.wait()
