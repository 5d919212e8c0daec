"""A run's processes on emulated hosts: each in a network namespace of its own, its egress capped by a
tc token bucket (deploy/netns/cluster.sh, `[network] bandwidth` / `--bandwidth`). Packets between
them cross real veth links and a bridge, so a 200 Mbit/s cap is a 200 Mbit/s network; loopback is
left behind. Needs root, iproute2 and the tbf qdisc (netem, for latency, is not in this kernel).

Each run gets a cluster of its own, so runs side by side never meet: subnet 10.77.N.0/24 with N free
(1-254; N 0 is cluster.sh's default, left to clusters made by hand), bridge psrvbrN, namespaces
psrvN-h0, psrvN-h1, ... Process i runs on host i, 10.77.N.(10+i): the servers first, then the workers
(or the all-reduce ranks). Each host's eth0 counts its bytes (`ip -s link`), one process per host, so
what a process sent and received is measured at its own interface (`interface_bytes`). A run's psrv processes
fork from its fork server and enter their host's namespace themselves (`netns`; psrv/cli/forkserver.py
`enter_netns`); anything else (a script's ranks) starts under `ip netns exec` (`wrap`).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

CLUSTER_SH = Path(__file__).resolve().parents[2] / "deploy" / "netns" / "cluster.sh"
CLAIMS = Path("/run/psrv-netns")  # N.owner: the launcher holding net N ("PID STARTTIME"); `lock` guards handing out
NETS = range(1, 255)  # a run's nets; net 0 (psrv-h*, psrvbr0, 10.77.0) is cluster.sh's default, for clusters by hand


@dataclass(frozen=True)
class Names:
    """The names of emulated cluster `net`: what cluster.sh is told in its environment."""

    net: int

    @property
    def subnet(self) -> str:
        return f"10.77.{self.net}"

    @property
    def prefix(self) -> str:  # namespace I is prefix + I
        return "psrv-h" if self.net == 0 else f"psrv{self.net}-h"

    @property
    def bridge(self) -> str:
        return f"psrvbr{self.net}"

    @property
    def veth(self) -> str:  # host I's veths are veth + vI (on the bridge) and veth + pI; at most 15 characters
        return "psrv-" if self.net == 0 else f"psrv{self.net}-"

    def env(self) -> dict[str, str]:
        return {"PSRV_NETNS_PREFIX": self.prefix, "PSRV_NETNS_BRIDGE": self.bridge,
                "PSRV_NETNS_SUBNET": self.subnet, "PSRV_NETNS_VETH": self.veth}

    def in_use(self, links: set[str], addresses: str, namespaces: set[str]) -> bool:
        """Whether anything of this net is up (`links`: the interfaces' names, `addresses`: `ip -o -4 addr`,
        `namespaces`: their names), whoever made it."""
        ours = lambda name, prefix: name.startswith(prefix) and name[len(prefix):].isdigit()  # noqa: E731
        return (self.bridge in links or any(ours(n, self.veth + "v") or ours(n, self.veth + "p") for n in links)
                or f" {self.subnet}." in addresses or any(ours(n, self.prefix) for n in namespaces))


def unavailable() -> str | None:
    """Why emulated hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths and tc need CAP_NET_ADMIN)"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    return None


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30).stdout


def _me(pid: int) -> str:
    """'PID STARTTIME' of process `pid` ('' once it is gone): who holds a net, the PID reused or not."""
    try:
        return f"{pid} {Path(f'/proc/{pid}/stat').read_text().rpartition(')')[2].split()[19]}"
    except (OSError, IndexError):
        return ""


@contextlib.contextmanager
def _handing_out() -> Iterator[None]:
    """The lock under which a net is claimed, so that two launchers starting at once never take the same one."""
    CLAIMS.mkdir(parents=True, exist_ok=True)
    with open(CLAIMS / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _up_now() -> tuple[set[str], str, set[str]]:
    """What is up: the interfaces' names, `ip -o -4 addr`, the namespaces' names."""
    links = {line.split(": ")[1].split("@")[0] for line in _ip("-o", "link", "show").splitlines()
             if line.count(": ") >= 2}
    namespaces = {line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()}
    return links, _ip("-o", "-4", "addr", "show"), namespaces


def claim() -> Names:
    """A net of its own for this process, its claim written: the first whose claim is free and of which
    nothing is up. The claims of launchers that are gone (killed before they could remove their hosts)
    are taken back first, their hosts removed. RuntimeError, in one line, when every net is held."""
    with _handing_out():
        for owner in CLAIMS.glob("*.owner"):
            held = owner.read_text().strip()
            if held.split(" ")[0].isdigit() and _me(int(held.split(" ")[0])) == held:
                continue
            if owner.stem.isdigit():
                _cluster_sh(Names(int(owner.stem)), "down")
            owner.unlink()
        up = _up_now()
        for net in NETS:
            names, owner = Names(net), CLAIMS / f"{net}.owner"
            if not owner.exists() and not names.in_use(*up):
                owner.write_text(_me(os.getpid()))
                return names
    raise RuntimeError(f"no free net for emulated hosts: 10.77.{NETS[0]}-{NETS[-1]}.0/24 are all held "
                       f"(see {CLAIMS})")


def release(names: Names) -> None:
    """Give `names`'s net back (its hosts removed already)."""
    with _handing_out():
        (CLAIMS / f"{names.net}.owner").unlink(missing_ok=True)


def _cluster_sh(names: Names, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **names.env()})


class EmulatedHosts:
    """`count` emulated hosts with egress capped at `rate` (e.g. "200mbit"; "" uncapped), on a net of
    their own (`names`), made on entry and removed on exit whatever happened. RuntimeError, in one line,
    where they cannot be made."""

    gloo_interface = "eth0"  # an all-reduce rank's gloo talks over its host's veth

    def __init__(self, count: int, rate: str):
        self.count, self.rate = count, rate
        self.names: Names | None = None

    def __enter__(self) -> EmulatedHosts:
        why = unavailable()
        if why:
            raise RuntimeError(f"network.bandwidth {self.rate}: emulated hosts {why}")
        self.names = claim()
        try:
            done = self.sh("up", str(self.count), self.rate)
        except BaseException:
            self.__exit__()
            raise
        if done.returncode != 0:
            self.__exit__()
            raise RuntimeError(f"network.bandwidth {self.rate}: cannot make emulated hosts: "
                               f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.sh("down")  # this net's alone
        finally:
            release(self.names)

    def sh(self, *args: str) -> subprocess.CompletedProcess:
        """deploy/netns/cluster.sh ARGS on these hosts (e.g. "rate", "2", "100mbit")."""
        return _cluster_sh(self.names, *args)

    @property
    def bridge(self) -> str:
        return self.names.bridge

    def namespace(self, host: int) -> str:
        return f"{self.names.prefix}{host}"

    def address(self, host: int) -> str:
        return f"{self.names.subnet}.{10 + host}"

    def netns(self, host: int) -> str:
        """The network namespace a process forked for `host` enters (experiments/launcher/cluster.py: a run's
        psrv processes fork from its fork server and enter it themselves, psrv/cli/forkserver.py)."""
        return self.namespace(host)

    def wrap(self, host: int, argv: list[str], *, name: str = "") -> list[str]:
        """`argv` run on `host` (ip netns exec execs it: the PID is the process's own), for what does not fork
        (a user's script, or every process where the fork server would not start); `name` is unused."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def interface_bytes(self, host: int) -> tuple[int, int]:
        """(bytes sent, bytes received) at `host`'s eth0 so far."""
        text = subprocess.run(["ip", "-n", self.namespace(host), "-s", "-j", "link", "show", "eth0"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
        stats = json.loads(text)[0]["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])


def host_traffic(cluster, rate: str) -> dict:
    """summary.json's `network`: the cap, the bridge, and each process's host (namespace, address) and bytes
    sent and received at its own interface over the whole run (start-up included); {} on 127.0.0.1 or under
    a scheduler."""
    if cluster.hosts is None or not rate:
        return {}
    hosts = {}
    for name, host in sorted(cluster.host_of.items(), key=lambda kv: kv[1]):
        try:
            sent, received = cluster.hosts.interface_bytes(host)
        except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError):
            sent = received = None
        hosts[name] = {"address": cluster.hosts.address(host), "namespace": cluster.hosts.namespace(host),
                       "bytes_sent": sent, "bytes_received": received}
    return {"network": {"bandwidth": rate, "bridge": cluster.hosts.bridge, "hosts": hosts}}
