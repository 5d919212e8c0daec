"""The nemesis's faults done to real processes (`sleep`s in a run's Cluster, no torch): a pause stops a process
(state T in /proc) and its heal continues it, a kill ends it and a later fault on it is recorded as not done,
primary:K follows the witness's latest epoch, a late ack is a fresh request file, a paused launcher stops its
own loop, and every fault still on is healed at the run's end. What needs root is in
tests/system/test_nemesis_root.py; a whole `psrv run` in tests/integration/test_run_nemesis.py."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.cluster import Cluster
from psrv.experiments.launcher.nemesis import Nemesis
from psrv.experiments.launcher.nemesis.faults import state


@pytest.fixture
def cluster(tmp_path):
    """A run's Cluster of `sleep` processes, stopped by PID at teardown."""
    c = Cluster(tmp_path, processes=4)
    yield c
    c.stop()


def _nemesis(out: Path, schedule: str, **cluster) -> Nemesis:
    cfg = from_dict(RunConfig, {"cluster": {"servers": 1, "workers": 2, **cluster}, "nemesis": {"schedule": schedule}})
    return Nemesis(cfg, out, time.monotonic())


def _step(out: Path, step: int) -> None:
    """Worker 0's progress file says `step` (as psrv/client/steplog.py writes it)."""
    (out / "worker-0.progress").write_text(str(step))


def _until(what, ready, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _running(pid: int) -> bool:
    """Alive and not stopped: R, S or D (a `sleep` just started can be in D while its pages load, under load)."""
    return state(pid) not in ("T", "t", "Z", "")


def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "nemesis.jsonl").read_text().splitlines()]


@pytest.mark.timeout(30)
def test_a_pause_stops_the_process_and_its_heal_continues_it(cluster, tmp_path):
    proc = cluster.start("worker-1", ["sleep", "30"])
    nemesis = _nemesis(tmp_path, "pause worker:1 at step 10 for 0.5s")
    nemesis.tick(cluster)
    assert _running(proc.pid) and not (tmp_path / "nemesis.jsonl").exists()  # not due before step 10
    _step(tmp_path, 10)
    nemesis.tick(cluster)
    _until("worker-1 stopped", lambda: state(proc.pid) == "T")
    paused = time.monotonic()
    while time.monotonic() - paused < 0.4:  # its duration not over yet: still stopped
        nemesis.tick(cluster)
        assert state(proc.pid) == "T"
        time.sleep(0.05)
    _until("worker-1 continued", lambda: nemesis.tick(cluster) or _running(proc.pid))
    fault, healed = _journal(tmp_path)
    assert fault["ev"] == "fault" and fault["done"] and fault["kind"] == "pause" and fault["target"] == "worker:1"
    assert fault["processes"] == ["worker-1"] and fault["pids"] == [proc.pid] and fault["step"] == 10
    assert healed["ev"] == "healed" and healed["id"] == fault["id"] and healed["healed"]
    assert healed["t"] - fault["t"] >= 0.5
    assert nemesis.summary()["by_kind"] == {"pause": {"done": 1, "not_done": 0}}


@pytest.mark.timeout(30)
def test_a_kill_ends_the_process_and_a_fault_on_it_later_is_not_done(cluster, tmp_path):
    proc = cluster.start("worker-1", ["sleep", "30"])
    nemesis = _nemesis(tmp_path, "kill worker:1 at step 10; pause worker:1 at step 20 for 1s")
    _step(tmp_path, 10)
    nemesis.tick(cluster)
    assert proc.returncode == -9 and state(proc.pid) == ""
    _step(tmp_path, 20)
    nemesis.tick(cluster)
    kill, pause = nemesis.summary()["faults"]
    assert kill["done"] and kill["pids"] == [proc.pid]
    assert not pause["done"] and pause["why"] == "worker-1 had ended already (exit code -9)"
    assert nemesis.said("worker-1").startswith("was killed by the nemesis (fault 1: kill worker:1 at step 10")
    assert cluster.failure("worker-1").startswith("worker-1 was killed by the nemesis (fault 1: kill worker:1 at "
                                                  "step 10, SIGKILL at worker 0's step 10); its output: ")


@pytest.mark.timeout(30)
def test_primary_k_is_the_process_the_witness_latest_epoch_names(cluster, tmp_path):
    procs = {name: cluster.start(name, ["sleep", "30"]) for name in ("server-0", "backup-0-1")}
    for port, name in enumerate(procs):
        (tmp_path / f"{name}.addr").write_text(f"tcp://127.0.0.1:{5000 + port}")
    nemesis = _nemesis(tmp_path, "pause primary:0 at step 10 for 0.2s; pause primary:0 at step 20 for 0.2s",
                       replicas=1)
    _step(tmp_path, 10)
    nemesis.tick(cluster)  # no witness yet: server-0
    witness = tmp_path / "witness" / "shard-0"
    witness.mkdir(parents=True)
    (witness / "epoch-1.json").write_text(json.dumps({"epoch": 1, "primary": "tcp://127.0.0.1:5001",
                                                     "backups": ["tcp://127.0.0.1:5000"]}))  # server-0 follows it
    _step(tmp_path, 20)
    nemesis.tick(cluster)  # the backup took over at epoch 1
    nemesis.heal()
    first, second = nemesis.summary()["faults"]
    assert first["processes"] == ["server-0"] and second["processes"] == ["backup-0-1"]
    assert second["pids"] == [procs["backup-0-1"].pid] and first["healed"] and second["healed"]


@pytest.mark.timeout(30)
def test_a_late_ack_is_a_request_file_with_a_fresh_id(cluster, tmp_path):
    proc = cluster.start("backup-0-1", ["sleep", "30"])
    (tmp_path / "backup-0-1.addr").write_text("tcp://127.0.0.1:5001")
    nemesis = _nemesis(tmp_path, "late_ack backup:0 at step 10 for 2s; late_ack backup:0 at step 20 for 0.5s",
                       replicas=1)
    path = tmp_path / "faults" / f"{proc.pid}.json"
    _step(tmp_path, 10)
    nemesis.tick(cluster)
    assert json.loads(path.read_text()) == {"id": 1, "late_ack_s": 2.0}
    _step(tmp_path, 20)
    nemesis.tick(cluster)
    assert json.loads(path.read_text()) == {"id": 2, "late_ack_s": 0.5}
    assert [f["file"] for f in nemesis.summary()["faults"]] == [str(path)] * 2


@pytest.mark.timeout(30)
def test_a_paused_launcher_stops_its_own_loop(cluster, tmp_path):
    nemesis = _nemesis(tmp_path, "pause launcher at step 10 for 0.5s")
    _step(tmp_path, 10)
    began = time.monotonic()
    nemesis.tick(cluster)
    assert time.monotonic() - began >= 0.5
    [pause] = nemesis.summary()["faults"]
    assert pause["processes"] == ["launcher"] and pause["healed"] and pause["healed_t"] - pause["t"] >= 0.5


@pytest.mark.timeout(30)
def test_every_fault_still_on_is_healed_at_the_end(cluster, tmp_path):
    proc = cluster.start("worker-1", ["sleep", "30"])
    nemesis = _nemesis(tmp_path, "pause worker:1 at step 10 for 60s; pause worker:1 at step 20 for 1s")
    _step(tmp_path, 20)
    nemesis.tick(cluster)
    _until("worker-1 stopped", lambda: state(proc.pid) == "T")
    nemesis.heal()
    _until("worker-1 continued", lambda: _running(proc.pid))
    first, second = nemesis.summary()["faults"]
    assert first["healed"] and first["healed_t"] - first["t"] < 60
    assert not second["done"] and second["why"] == "paused already by fault 1"
