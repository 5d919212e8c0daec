"""A process's share of the host's cores (psrv/process.py): the one rule psrv run gives the processes it
starts and psrv serve / psrv worker started by hand apply to themselves, and which processes count."""
from __future__ import annotations

import os

import pytest

from psrv.process import _is_psrv_process, cores_each, psrv_processes_here, thread_count, usable_cores
from psrv.experiments.launcher.cluster import thread_env


@pytest.mark.parametrize(("argv", "counted"), [
    (["psrv", "serve", "--workers", "4"], True),
    (["/opt/venv/bin/python3", "/opt/venv/bin/psrv", "worker", "--rank", "1"], True),  # a console script
    (["python3", "-P", "-m", "psrv.cli", "serve", "--config", "s.json"], True),  # as psrv run starts them
    (["ip", "netns", "exec", "psrv-h1", "psrv", "worker"], False),  # a wrapper: ip execs psrv, which counts
    (["srun", "--overlap", "psrv", "serve"], False),
    (["timeout", "60", "psrv", "worker"], False),
    (["python3", "-m", "psrv.cli", "run", "--workers", "4"], False),  # the launcher runs no torch math
    (["psrv", "top", "--servers", "tcp://h:1"], False),
    (["vim", "psrv", "serve"], False),
])
def test_which_processes_share_the_cores(argv, counted):
    assert _is_psrv_process(argv) is counted


def _proc(tmp_path, *commands):
    for pid, argv in enumerate(commands, start=100):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (tmp_path / "self").mkdir()  # not a process
    return tmp_path


def test_the_count_is_the_psrv_processes_on_the_host_and_this_one(tmp_path):
    proc = _proc(tmp_path, ["psrv", "serve"], ["psrv", "worker"], ["psrv", "worker"], ["bash"],
                 ["srun", "psrv", "worker"])
    assert psrv_processes_here(proc) == 4  # 3 listed, and the caller (not in this /proc)


def test_the_share_is_the_cores_split_evenly_at_least_one():
    cores = usable_cores()
    assert cores == len(os.sched_getaffinity(0))
    assert [cores_each(n) for n in (1, cores, 4 * cores)] == [cores, 1, 1]


def test_a_thread_count_given_or_in_the_environment_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert thread_count(5) == (5, "--threads")
    assert thread_count(0) == (3, "OMP_NUM_THREADS")
    assert thread_env(2) == {}  # psrv run leaves it too
    monkeypatch.delenv("OMP_NUM_THREADS")
    count, why = thread_count(0)
    assert why.startswith(f"{usable_cores()} cores / ") and why.endswith(" psrv processes on this host")
    assert thread_env(2) == {"OMP_NUM_THREADS": str(cores_each(2))}


def test_a_forked_process_titled_in_one_piece_is_counted(tmp_path):
    """psrv run's fork server titles each child with its command line in one piece (setproctitle)."""
    from psrv.process import psrv_processes_here
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "cmdline").write_bytes(b"/usr/bin/python -P -m psrv.cli serve --config c.json\0\0\0")
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "cmdline").write_bytes(b"/usr/bin/python -P -m psrv.cli.forkserver 7\0")
    assert psrv_processes_here(tmp_path) == 2  # this one and the shard; not the fork server
