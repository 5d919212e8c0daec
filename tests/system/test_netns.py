"""Emulated multi-host run on network namespaces (deploy/netns/cluster.sh): servers on h0, workers on
h1 (2) and h2 (1) whose egress is capped at 200 Mbit/s. The job trains to the end and the capped
host's communication time rises. The hosts are on a net of their own (experiments/launcher/netns.py), so these
tests run beside others and beside runs.

Needs root, iproute2 and tc; skipped otherwise.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psrv.experiments.launcher.netns import EmulatedHosts
from tests.helpers import ROOT

pytestmark = [pytest.mark.root, pytest.mark.slow]

CAP = "200mbit"
STEPS = 4   # steps 1-3 (after connecting) already tell the capped host at ~1.4 s a push from tens of ms


def _skip_unless_netns() -> None:
    """Skip without root or iproute2."""
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces, veths and tc need CAP_NET_ADMIN")
    if not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("needs iproute2 (ip, tc)")


def _gone(hosts: EmulatedHosts) -> bool:
    """Whether `hosts`'s bridge and namespaces are removed."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    bridge = subprocess.run(["ip", "link", "show", hosts.bridge], capture_output=True).returncode == 0
    return not bridge and hosts.namespace(0) not in names


@pytest.fixture
def emulated():
    """Three emulated hosts on a net of their own, uncapped; removed at teardown, whatever happened."""
    _skip_unless_netns()
    hosts = EmulatedHosts(3, "")
    try:
        hosts.__enter__()
    except RuntimeError as exc:
        pytest.skip(f"cannot make network namespaces here: {exc}")
    try:
        yield hosts
    finally:
        hosts.__exit__()
    assert _gone(hosts), "cluster.sh down left namespaces or the bridge behind"


@pytest.fixture
def cluster(emulated):
    """Three emulated hosts, h2 capped at CAP."""
    done = emulated.sh("rate", "2", CAP)
    assert done.returncode == 0, done.stderr
    return emulated


class Hosts:
    """psrv processes on the emulated hosts (`emulated`); each is killed by PID (its session) at teardown."""

    def __init__(self, tmp: Path, emulated: EmulatedHosts):
        self.tmp, self.emulated = tmp, emulated
        self.started: dict[str, subprocess.Popen] = {}

    def start(self, host: int, name: str, *args: str) -> subprocess.Popen:
        with open(self.tmp / f"{name}.log", "w") as log:
            p = subprocess.Popen(self.emulated.wrap(host, [sys.executable, "-m", "psrv.cli", *args]),
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        self.started[name] = p
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def wait_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for name, p in self.started.items():
            try:
                rc = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name} still running after {timeout}s; log:\n{self.log(name)}") from None
            assert rc == 0, f"{name} exited with {rc}; log:\n{self.log(name)}"

    def kill_all(self) -> None:
        for p in self.started.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def hosts(tmp_path, cluster):
    h = Hosts(tmp_path, cluster)
    yield h
    h.kill_all()


@pytest.mark.timeout(240)
def test_capped_worker_host_communicates_slower(cluster, hosts, tmp_path):
    # stays slow: each namespace is a host of its own, so every shard and worker is a process in it, and a
    # push through the 200 Mbit/s cap takes over a second by construction
    shards = [f"tcp://{cluster.address(0)}:{5555 + i}" for i in range(2)]
    for i, address in enumerate(shards):
        hosts.start(0, f"server-{i}", "serve", "--bind", address, "--shard", str(i), "--num-shards", "2",
                    "--workers", "3", "--mode", "async", "--ready-file", str(tmp_path / f"server-{i}.addr"),
                    "--out", str(tmp_path / f"server-{i}.json"))
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"server-{i}.addr").exists() for i in range(2)):
        for name, p in hosts.started.items():
            assert p.poll() is None, f"{name} exited early; log:\n{hosts.log(name)}"
        assert time.monotonic() < deadline, "servers did not start listening within 60s"
        time.sleep(0.1)
    for rank, host in ((0, 1), (1, 1), (2, 2)):
        hosts.start(host, f"worker-{rank}", "worker", "--servers", ",".join(shards), "--rank", str(rank),
                    "--world-size", "3", "--job", "synthetic_mlp", "--steps", str(STEPS), "--batch-size", "32",
                    "--out", str(tmp_path / f"worker-{rank}.json"))
    hosts.wait_all(timeout=200)   # every worker trained to the end and every shard exited, all with 0

    workers = [json.loads((tmp_path / f"worker-{r}.json").read_text()) for r in range(3)]
    assert [len(w["step_log"]) for w in workers] == [STEPS] * 3
    servers = [json.loads((tmp_path / f"server-{i}.json").read_text()) for i in range(2)]
    assert [s["updates_applied"] for s in servers] == [3 * STEPS] * 2
    # Step 0 also pays for connecting; from then on each push is ~34 MB, which the 200 Mbit/s
    # cap on h2's egress stretches to well over a second, against tens of ms on the open link.
    comm = [statistics.mean(r["communication_seconds"] for r in w["step_log"][1:]) for w in workers]
    record = {"communication_seconds_mean": {"h1/rank0": comm[0], "h1/rank1": comm[1], "h2/rank2": comm[2]},
              "cap": CAP, "parameters": workers[0]["parameters"]}
    (tmp_path / "netns_result.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record))
    assert comm[2] > 1.5 * max(comm[0], comm[1]), record


@pytest.fixture
def no_cluster():
    """Root and iproute2: `psrv run --bandwidth` makes and removes its own hosts, on a net of its own."""
    _skip_unless_netns()


def _left(summary: dict) -> list[str]:
    """What of a run's emulated hosts (its summary's `network`) is still up: none once it ended."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    network = summary["network"]
    left = [h["namespace"] for h in network["hosts"].values() if h["namespace"] in names]
    return left + [network["bridge"]] * (subprocess.run(["ip", "link", "show", network["bridge"]],
                                                        capture_output=True).returncode == 0)


@pytest.mark.timeout(240)
def test_psrv_run_on_capped_emulated_hosts(no_cluster, tmp_path):
    """Sync PS with a ~34 MB model on hosts capped at 200 Mbit/s: every push and its answer take over a
    second, longer than the client's first probe (1 s), and yet no request is sent twice (a probe's
    answer queued behind the weights once made the client re-send every push); each process's bytes
    are measured at its own host's interface, at least what the client counted."""
    # stays slow: the ~34 MB model through a 200 Mbit/s cap is the point (pushes longer than the first probe)
    from tests.helpers import psrv_run
    s = psrv_run(tmp_path / "ps", "--job", "synthetic_mlp", "--mode", "sync", "--workers", "2", "--servers", "1",
                 "--steps", "3", "--bandwidth", CAP, timeout=200)
    server = json.loads((tmp_path / "ps" / "server-0.json").read_text())
    assert s["complete"] and server["duplicates"] == 0 and server["updates_applied"] == 3, server
    hosts = s["network"]["hosts"]
    assert s["network"]["bandwidth"] == CAP and set(hosts) == {"server-0", "worker-0", "worker-1"}, s["network"]
    net = hosts["server-0"]["address"].rsplit(".", 1)[0]  # the run's own 10.77.N.0/24, host i at .(10+i)
    assert [h["address"] for h in hosts.values()] == [f"{net}.10", f"{net}.11", f"{net}.12"] and not _left(s)
    for rank in range(2):
        w = json.loads((tmp_path / "ps" / f"worker-{rank}.json").read_text())
        assert hosts[f"worker-{rank}"]["bytes_sent"] >= w["bytes_sent"] > 3 * 30e6, (hosts, w["bytes_sent"])
    comm = statistics.mean(r["communication_seconds"] for r in json.loads(
        (tmp_path / "ps" / "worker-1.json").read_text())["step_log"][1:])
    assert comm > 1.0, comm  # ~34 MB each way at 25 MB/s: the cap is real


@pytest.mark.timeout(120)
def test_ddp_on_capped_emulated_hosts(no_cluster, tmp_path):
    from tests.helpers import psrv_run
    s = psrv_run(tmp_path, "--job", "digits_mlp", "--mode", "ddp", "--workers", "2", "--steps", "5",
                 "--bandwidth", CAP, timeout=100)
    assert s["complete"] and set(s["network"]["hosts"]) == {"worker-0", "worker-1"}, s
    assert all(h["bytes_sent"] > 0 for h in s["network"]["hosts"].values()), s["network"]
    assert not _left(s), "psrv run --bandwidth left namespaces or the bridge behind"


def _view() -> dict:
    """What a process sees of its host: its interfaces, its /etc/hosts, whether it can bind an address."""
    return {"links": sorted(os.listdir("/sys/class/net")), "hosts": Path("/etc/hosts").read_text(),
            "resolv": Path("/etc/resolv.conf").read_text()}


@pytest.mark.timeout(60)
def test_a_forked_process_enters_its_host_as_ip_netns_exec_would(emulated):
    # a run's processes on emulated hosts fork from its fork server and enter their host themselves
    # (psrv/cli/forkserver.py enter_netns): the same interfaces, /etc/hosts and resolv.conf (without the last two a
    # peer's reverse lookup waited 10 s for a resolver), and the host's address to bind
    from psrv.cli.forkserver import enter_netns
    probe = ("import json, os, pathlib, socket; s = socket.socket(); s.bind((%r, 0)); "
             "print(json.dumps({'links': sorted(os.listdir('/sys/class/net')), "
             "'hosts': pathlib.Path('/etc/hosts').read_text(), "
             "'resolv': pathlib.Path('/etc/resolv.conf').read_text()}))") % emulated.address(1)
    wrapped = json.loads(subprocess.run(emulated.wrap(1, [sys.executable, "-c", probe]), capture_output=True,
                                        text=True, timeout=30, check=True).stdout)
    mine = _view()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            enter_netns(emulated.netns(1))
            import socket
            socket.socket().bind((emulated.address(1), 0))
            os.write(write_fd, json.dumps(_view()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        forked = json.loads(pipe.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and forked == wrapped, (forked, wrapped)
    assert "eth0" in forked["links"] and emulated.namespace(2) in forked["hosts"]
    assert _view() == mine  # the test process itself stays where it was
