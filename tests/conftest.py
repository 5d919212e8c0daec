"""Shared fixtures: psrv processes a test starts are killed by PID at teardown."""
import pytest

from tests.helpers import Procs


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    yield ps
    ps.kill_all()
