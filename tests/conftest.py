"""Shared fixtures: psrv processes a test starts are killed by PID at teardown; the runs a test process starts fork
their fork servers from one zygote of its own (psrv/cli/zygote.py)."""
import os
import signal
import subprocess
import sys
import tempfile

# MKL takes its fastest code path for the CPU it finds. On the lent H200 machine's Intel Xeon (AVX-512, torch 2.11),
# three conformance cases whose int8 or sign codec turns a last-bit difference of a gradient into a whole
# quantisation step failed by 4e-5 to 7e-4, and all three passed with MKL_CBWR=AVX2 or COMPATIBLE (MKL's reproducible
# branches) or ATEN_CPU_CAPABILITY=avx2 (docs/benchmarks.md, "GPU"): that path's bits differ between psrv's
# computation and the reference's of the same math (operands laid out differently, we think; not established). AVX2,
# not COMPATIBLE: here (an AMD EPYC, where the cases pass either way) COMPATIBLE made a float32 matrix product 2.3x
# slower and AVX2 changed nothing. MKL reads the setting once, at its first call, so it is set here, before any
# test imports torch; the processes the tests start inherit it.
os.environ.setdefault("MKL_CBWR", "AVX2")

import pytest  # noqa: E402
import torch  # noqa: E402

from psrv.experiments.launcher.forkserver import ZYGOTE  # noqa: E402
from tests.helpers import Procs  # noqa: E402

# One torch thread in each pytest process, as `psrv run` gives each of its processes where they outnumber the
# cores: `make test` runs two more pytest processes than cores, and a second thread in each only waits for a
# descheduled peer (tests/conformance/test_plan.py and tests/unit/test_simulate.py took 22.8 s of CPU with two,
# 17.9 s with one, here). A process a test starts from a command line sets its own.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def zygote():
    """One import of torch for every run this test process starts, not one per run's fork server (about 1.4 s of CPU
    each, 140 runs in the suite): a zygote, whose socket the runs find in PSRV_ZYGOTE (os.environ, which the
    processes a test starts inherit). Until it listens, and where a test takes it out of the environment, a run
    starts its own fork server, as it does for a user. PSRV_TEST_ZYGOTE=0: no zygote. Yields its socket's path."""
    if os.environ.get("PSRV_TEST_ZYGOTE", "1") == "0":
        yield None
        return
    folder = tempfile.mkdtemp(prefix="psrv-zygote-")
    path = os.path.join(folder, "socket")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop(ZYGOTE, None)
    with open(os.path.join(folder, "log"), "w") as log:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "psrv.cli.zygote", path], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    os.environ[ZYGOTE] = path
    try:
        yield path
    finally:
        os.environ.pop(ZYGOTE, None)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for name in ("socket", "log"):
            if os.path.exists(os.path.join(folder, name)):
                os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


@pytest.fixture
def own_fork_server(monkeypatch):
    """A run started in this test starts its own fork server, as a user's does (a test of the launcher's own
    process tree)."""
    monkeypatch.delenv(ZYGOTE, raising=False)


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    yield ps
    ps.kill_all()


def pytest_collection_modifyitems(items):
    """The longest files first (tests/file_durations.py): with `--no-loadscope-reorder`, the order xdist hands
    the files out in."""
    from tests.file_durations import load, longest_first
    items[:] = longest_first(items, load())
