"""Shared fixtures: psrv processes a test starts are killed by PID at teardown."""
import pytest

from tests.helpers import Procs


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
