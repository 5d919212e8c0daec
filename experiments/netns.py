"""A run's processes on emulated hosts: each in a network namespace of its own, its egress capped by a
tc token bucket (deploy/netns/cluster.sh, `[network] bandwidth` / `--bandwidth`). Packets between
them cross real veth links and a bridge, so a 200 Mbit/s cap is a 200 Mbit/s network; loopback is
left behind. Needs root, iproute2 and the tbf qdisc (netem, for latency, is not in this kernel).

Process i runs on host i, 10.77.0.(10+i): the servers first, then the workers (or the all-reduce
ranks). Each host's eth0 counts its bytes (`ip -s link`), one process per host, so what a process
sent and received is measured at its own interface (`interface_bytes`).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

CLUSTER_SH = Path(__file__).resolve().parents[1] / "deploy" / "netns" / "cluster.sh"
PREFIX, NS_PREFIX, BRIDGE = "10.77.0", "psrv-h", "psrvbr0"


def unavailable() -> str | None:
    """Why emulated hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths and tc need CAP_NET_ADMIN)"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    return None


def existing() -> bool:
    """True if emulated hosts (psrv-h*, psrvbr0) are up already: another run or a user's cluster."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    bridge = subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0
    return bridge or any(line.split()[0].startswith(NS_PREFIX) for line in names.splitlines() if line.strip())


class EmulatedHosts:
    """`count` emulated hosts with egress capped at `rate` (e.g. "200mbit"), made on entry and removed
    on exit whatever happened. RuntimeError, in one line, where they cannot be made."""

    def __init__(self, count: int, rate: str):
        self.count, self.rate = count, rate

    def __enter__(self) -> EmulatedHosts:
        why = unavailable()
        if why:
            raise RuntimeError(f"network.bandwidth {self.rate}: emulated hosts {why}")
        if existing():
            raise RuntimeError(f"network.bandwidth {self.rate}: emulated hosts ({NS_PREFIX}*, {BRIDGE}) are up "
                               f"already; another run holds them, or run `{CLUSTER_SH} down`")
        done = self._sh("up", str(self.count), self.rate)
        if done.returncode != 0:
            self._sh("down")
            raise RuntimeError(f"network.bandwidth {self.rate}: cannot make emulated hosts: "
                               f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        return self

    def __exit__(self, *exc) -> None:
        self._sh("down")

    def _sh(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=120)

    @staticmethod
    def address(host: int) -> str:
        return f"{PREFIX}.{10 + host}"

    gloo_interface = "eth0"  # an all-reduce rank's gloo talks over its host's veth

    @staticmethod
    def wrap(host: int, argv: list[str], *, name: str = "") -> list[str]:
        """`argv` run on `host` (ip netns exec execs it: the PID is the process's own); `name` is unused."""
        return ["ip", "netns", "exec", f"{NS_PREFIX}{host}", *argv]

    @staticmethod
    def interface_bytes(host: int) -> tuple[int, int]:
        """(bytes sent, bytes received) at `host`'s eth0 so far."""
        text = subprocess.run(["ip", "-n", f"{NS_PREFIX}{host}", "-s", "-j", "link", "show", "eth0"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
        stats = json.loads(text)[0]["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])


def host_traffic(cluster, rate: str) -> dict:
    """summary.json's `network`: the cap, and each process's bytes sent and received at its own host's
    interface over the whole run (start-up included); {} on 127.0.0.1 or under a scheduler."""
    if cluster.hosts is None or not rate:
        return {}
    hosts = {}
    for name, host in sorted(cluster.host_of.items(), key=lambda kv: kv[1]):
        try:
            sent, received = cluster.hosts.interface_bytes(host)
        except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError):
            sent = received = None
        hosts[name] = {"address": cluster.hosts.address(host), "bytes_sent": sent, "bytes_received": received}
    return {"network": {"bandwidth": rate, "hosts": hosts}}
