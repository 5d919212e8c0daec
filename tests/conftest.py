"""Shared fixtures: psrv processes a test starts are killed by PID at teardown."""
import os

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

from tests.helpers import Procs  # noqa: E402


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
