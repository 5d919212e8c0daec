"""The nemesis's faults that need root, done to real hosts and a real filesystem: a partition between two
emulated hosts (network namespaces, deploy/netns/cluster.sh) cuts them apart while both still reach a third,
and is healed; disk_full fills the tmpfs at DIR/checkpoints and frees it, and what was written there stays in
the run folder once it is unmounted. Skipped without root."""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.cluster import Cluster
from psrv.experiments.launcher.nemesis import Nemesis, checkpoint_disk
from psrv.experiments.launcher.nemesis.faults import is_tmpfs
from psrv.experiments.launcher.netns import EmulatedHosts
from tests.system.test_netns import _skip_unless_netns

pytestmark = [pytest.mark.root]

PORT = 7000
LISTEN = (f"import socket, time; s = socket.create_server(('0.0.0.0', {PORT})); s.settimeout(0.2)\n"
          "while True:\n    try: s.accept()[0].close()\n    except OSError: pass")


def _nemesis(out: Path, schedule: str, **more) -> Nemesis:
    cfg = from_dict(RunConfig, {"cluster": {"servers": 1, "workers": 2}, "nemesis": {"schedule": schedule}, **more})
    return Nemesis(cfg, out, time.monotonic())


def _reaches(hosts: EmulatedHosts, host: int, to: int) -> bool:
    """Whether a TCP connection from emulated host `host` to `to`'s listener is made within 1 s."""
    probe = (f"import socket; socket.create_connection(('{hosts.address(to)}', {PORT}), timeout=1)")
    return subprocess.run(hosts.wrap(host, [sys.executable, "-c", probe]), capture_output=True,
                          timeout=20).returncode == 0


@pytest.fixture
def three_hosts(tmp_path):
    """Emulated hosts h0-h2 on a net of their own, uncapped, removed at teardown; a run's Cluster on them,
    stopped by PID."""
    _skip_unless_netns()
    with EmulatedHosts(3, "") as hosts:
        cluster = Cluster(tmp_path, processes=3, hosts=hosts)
        try:
            yield cluster
        finally:
            cluster.stop()
    assert subprocess.run(["ip", "link", "show", hosts.bridge], capture_output=True).returncode != 0, "left behind"


@pytest.mark.timeout(60)
def test_a_partition_cuts_two_hosts_apart_while_both_reach_a_third_and_heals(three_hosts, tmp_path):
    cluster = three_hosts
    reaches = lambda host, to: _reaches(cluster.hosts, host, to)  # noqa: E731
    for name, host in (("server-0", 0), ("worker-1", 1), ("worker-0", 2)):  # each listens on its host
        cluster.start(name, [sys.executable, "-c", LISTEN], host=host)
    deadline = time.monotonic() + 15
    while not all(reaches(2, h) for h in (0, 1)):
        assert time.monotonic() < deadline, "the listeners did not come up"
    nemesis = _nemesis(tmp_path, "partition worker:1/primary:0 at step 10 for 30s; "
                                 "partition primary:0/worker:1 at step 10 for 1s")
    (tmp_path / "worker-0.progress").write_text("10")
    nemesis.tick(cluster)
    try:
        cut = (reaches(1, 0), reaches(0, 1), reaches(1, 2), reaches(0, 2), reaches(2, 0), reaches(2, 1))
    finally:
        nemesis.heal()
    assert cut == (False, False, True, True, True, True), "h0 and h1 cut apart, each still reaching h2"
    assert reaches(1, 0) and reaches(0, 1), "healed"
    fault, again = nemesis.summary()["faults"]
    assert fault["done"] and fault["processes"] == ["worker-1", "server-0"] and fault["healed"], fault
    assert not again["done"] and again["why"] == "cut apart already by fault 1", again
    assert fault["addresses"] == [cluster.hosts.address(1), cluster.hosts.address(0)]
    assert subprocess.run(["ip", "-n", cluster.hosts.namespace(0), "route", "show", "type", "blackhole"],
                          capture_output=True, text=True).stdout == "", "the routes are gone"


def _write(path: Path, size: int) -> int | None:
    """Write `size` bytes to `path`: None, or the errno that refused them."""
    try:
        path.write_bytes(bytes(size))
    except OSError as exc:
        return exc.errno
    return None


@pytest.mark.timeout(60)
def test_disk_full_fills_the_checkpoint_tmpfs_frees_it_and_the_files_stay(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    schedule = "disk_full at step 10 for 30s"
    cfg = from_dict(RunConfig, {"checkpoints": {"every": 1.0}, "nemesis": {"schedule": schedule, "disk_mb": 4}})
    disk = tmp_path / "checkpoints"
    with checkpoint_disk(cfg, tmp_path):
        assert is_tmpfs(disk) and os.statvfs(disk).f_blocks * os.statvfs(disk).f_frsize == 4 << 20
        assert _write(disk / "shard-0-of-1.ckpt", 1 << 20) is None  # a checkpoint before the fault
        nemesis = Nemesis(cfg, tmp_path, time.monotonic())
        (tmp_path / "worker-0.progress").write_text("10")
        nemesis.tick(None)  # disk_full names no process
        assert os.statvfs(disk).f_bavail == 0
        assert _write(disk / "shard-0-of-1.ckpt.tmp", 4096) == errno.ENOSPC
        nemesis.heal()
        assert os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize >= 2 << 20
        assert _write(disk / "shard-0-of-1.ckpt.tmp", 4096) is None
    assert not is_tmpfs(disk), "unmounted"
    assert sorted(p.name for p in disk.iterdir()) == ["shard-0-of-1.ckpt", "shard-0-of-1.ckpt.tmp"]
    assert (disk / "shard-0-of-1.ckpt").stat().st_size == 1 << 20, "the checkpoint stays in the run folder"
    [fault] = [json.loads(line) for line in (tmp_path / "nemesis.jsonl").read_text().splitlines()][:1]
    assert fault["kind"] == "disk_full" and fault["done"] and fault["processes"] == [] and fault["target"] == ""


@pytest.mark.timeout(60)
def test_disk_full_never_fills_a_folder_that_is_not_its_tmpfs(tmp_path):
    cfg = from_dict(RunConfig, {"checkpoints": {"every": 1.0}, "nemesis": {"schedule": "disk_full at step 10 for 1s"}})
    (tmp_path / "checkpoints").mkdir()
    nemesis = Nemesis(cfg, tmp_path, time.monotonic())
    (tmp_path / "worker-0.progress").write_text("10")
    nemesis.tick(None)
    [fault] = nemesis.summary()["faults"]
    assert not fault["done"] and "is not a tmpfs of its own" in fault["why"]
    assert list((tmp_path / "checkpoints").iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("schedule", "line"), [
    ("partition worker:1/primary:0 at 1s for 1s", "psrv run: error: --nemesis partition puts each process on an "
     "emulated host, and making them needs root (network namespaces, veths and tc need CAP_NET_ADMIN); kill, "
     "pause and late_ack need neither root nor emulated hosts"),
    ("disk_full at 1s for 1s", "psrv run: error: --nemesis disk_full: mounting a tmpfs at DIR/checkpoints needs "
     "root; kill, pause and late_ack do not"),
])
def test_without_root_a_partition_and_disk_full_are_refused_in_one_line(tmp_path, schedule, line):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("runs psrv run as the user nobody: needs root and setpriv")
    tmp_path.chmod(0o777)
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                           "psrv.cli", "run", "--mode", "async", "--servers", "1", "--steps", "10",
                           "--checkpoint-every", "1", "--nemesis", schedule, "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=50, cwd=tmp_path, env={**os.environ,
                                                                                        "HOME": str(tmp_path)})
    assert (done.returncode, done.stderr.strip(), done.stdout) == (2, line, "")
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_partition_between_a_primary_and_its_only_backup_splits_no_brain(mode, tmp_path):
    """A live primary and its only backup cut apart (each on its emulated host, both still reaching the workers'):
    the backup hears nothing and claims the shard on the witness, the primary's ack waits end in a claim too;
    one wins, the other is fenced or dropped, and the run finishes with every acknowledged push applied once in
    the final lineage and one primary per epoch (the checker). Sync ends with the weights of the run without it."""
    _skip_unless_netns()
    from psrv.experiments.launcher.history import check_run
    from tests.helpers import psrv_run
    job = ("--mode", mode, "--servers", "1", "--replicas", "1", "--workers", "2", "--steps", "400",
           "--compute-ms", "20", "--optimizer", "sgd", "--momentum", "0.9")
    summary = psrv_run(tmp_path / "cut", *job, "--nemesis", "partition primary:0/backup:0 at step 40 for 3s",
                       timeout=140)
    [fault] = summary["faults"]["nemesis"]["faults"]
    assert fault["done"] and fault["healed"], fault
    result = check_run(tmp_path / "cut")
    assert result.ok, result.line()
    assert result.counts.acknowledged == 2 * 400 and result.counts.epochs >= 3  # a claim was made on the cut
    if mode == "sync":
        psrv_run(tmp_path / "plain", *job, timeout=140)
        assert torch.equal(torch.load(tmp_path / "cut" / "params.pt"), torch.load(tmp_path / "plain" / "params.pt"))


@pytest.mark.timeout(150)
def test_a_full_disk_during_checkpoints_changes_no_weight(tmp_path):
    """sync with checkpoints every 0.3 s while the disk holding them is full for 2 s (a tmpfs the nemesis fills):
    the writes fail with ENOSPC and are said in the shard's log, training goes on, and the weights are those of
    the run without it, bit for bit (a checkpoint is a copy: its write never touches the shard)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the nemesis mounts a tmpfs at DIR/checkpoints")
    from tests.helpers import psrv_run
    job = ("--mode", "sync", "--servers", "1", "--workers", "2", "--steps", "200", "--compute-ms", "20",
           "--optimizer", "sgd", "--momentum", "0.9", "--checkpoint-every", "0.3")
    summary = psrv_run(tmp_path / "full", *job, "--nemesis", "disk_full at step 40 for 2s", "--nemesis-disk-mb", "16",
                       timeout=140)
    [fault] = summary["faults"]["nemesis"]["faults"]
    assert fault["done"] and fault["healed"], fault
    assert "No space left on device" in (tmp_path / "full" / "server-0.log").read_text()
    psrv_run(tmp_path / "plain", *job, timeout=140)
    assert torch.equal(torch.load(tmp_path / "full" / "params.pt"), torch.load(tmp_path / "plain" / "params.pt"))
