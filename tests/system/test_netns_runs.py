"""Emulated hosts per run (experiments/launcher/netns.py): two `psrv run --script ... --bandwidth` at once on one
machine, a sync one against a shard and a ddp one, each on a net of its own (namespaces, bridge, /24), each
rank on a capped host; both finish, and nothing of theirs is left. A launcher killed with its hosts up
leaves a claim the next one takes back, removing those hosts.

Needs root and iproute2 (CI runs as root); skipped otherwise.
"""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from psrv.experiments.launcher.netns import CLAIMS, EmulatedHosts
from tests.helpers import ROOT, psrv_argv
from tests.system.test_netns import _skip_unless_netns

pytestmark = [pytest.mark.root]

SCRIPT = ROOT / "tests" / "integration" / "script_loop.py"  # user_loop's model, stops after PSRV_STEPS
CAP, STEPS = "200mbit", 3


def _netns() -> set[str]:
    return {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.splitlines() if line.strip()}


def _link_up(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


@pytest.mark.timeout(150)
def test_two_script_runs_on_capped_hosts_at_once_each_on_a_net_of_its_own(tmp_path):
    _skip_unless_netns()
    same = ("--workers", "2", "--steps", str(STEPS), "--lr", "0.1", "--momentum", "0.9", "--bandwidth", CAP)
    runs = {"sync": ("--mode", "sync", "--servers", "1"), "ddp": ("--mode", "ddp")}
    procs = {mode: subprocess.Popen(
        psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--out", str(tmp_path / mode), *args, *same,
                  "--script", str(SCRIPT), "1", str(tmp_path / f"{mode}.pt")),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for mode, args in runs.items()}
    try:
        said = {mode: p.communicate(timeout=130)[0] for mode, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)  # psrv run stops its processes and removes its hosts
                p.wait(30)
    assert {m: p.returncode for m, p in procs.items()} == {"sync": 0, "ddp": 0}, said
    summaries = {mode: json.loads((tmp_path / mode / "summary.json").read_text()) for mode in runs}
    nets = {}
    for mode, s in summaries.items():
        network = s["network"]
        hosts = network["hosts"]
        assert s["complete"] and network["bandwidth"] == CAP, s
        assert set(hosts) == ({"server-0", "worker-0", "worker-1"} if mode == "sync" else {"worker-0", "worker-1"})
        subnet = {ipaddress.ip_network(f"{h['address']}/24", strict=False) for h in hosts.values()}
        assert len(subnet) == 1 and len({h["address"] for h in hosts.values()}) == len(hosts), hosts
        assert all(h["bytes_sent"] > 1000 and h["bytes_received"] > 1000 for h in hosts.values()), hosts
        if mode == "sync":  # PSRV_SERVERS names server-0.addr, the shard's address on its host
            assert (tmp_path / mode / "server-0.addr").read_text().startswith(f"tcp://{hosts['server-0']['address']}:")
        for rank in range(2 if mode == "sync" else 0):  # what a PS rank's client counted, at most its eth0's
            sent = json.loads((tmp_path / mode / f"worker-{rank}.json").read_text())["bytes_sent"]
            assert hosts[f"worker-{rank}"]["bytes_sent"] >= sent > 0, (hosts, sent)
        nets[mode] = (subnet.pop(), network["bridge"], {h["namespace"] for h in hosts.values()})
    assert nets["sync"][0] != nets["ddp"][0] and nets["sync"][1] != nets["ddp"][1], nets  # side by side
    for subnet, bridge, namespaces in nets.values():
        # Each run removed its hosts, unless what is up under those names is a later run's: nets are handed out
        # lowest first, so another test's run may have claimed this net since (netns.claim() hands out a net only
        # with nothing of it up, and writes its claim before bringing its own hosts up)
        left = _link_up(bridge) or bool(namespaces & _netns())
        net = int(bridge.removeprefix("psrvbr"))
        assert not left or (CLAIMS / f"{net}.owner").exists(), f"{bridge} or {namespaces} left behind"
    # the cap changes no number: sync PS and DDP train the script to the same weights
    torch.testing.assert_close(torch.load(tmp_path / "sync" / "params.pt"), torch.load(tmp_path / "ddp" / "params.pt"),
                               rtol=0, atol=1e-5)


@pytest.mark.timeout(60)
def test_hosts_a_killed_launcher_left_are_removed_by_the_next_and_never_block_it(tmp_path):
    _skip_unless_netns()
    holder = ("import sys, time\nfrom psrv.experiments.launcher.netns import EmulatedHosts\n"
              "with EmulatedHosts(2, '') as h:\n    print(h.names.net, flush=True)\n    time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        net = int(proc.stdout.readline())
    finally:
        proc.kill()  # as kill -9: its hosts stay up, and its claim
        proc.wait()
    left = {f"psrv{net}-h0", f"psrv{net}-h1"}
    assert left <= _netns() and _link_up(f"psrvbr{net}") and (CLAIMS / f"{net}.owner").exists()
    with EmulatedHosts(1, CAP) as hosts:  # one host: psrvN-h1 is the killed launcher's alone, were it N again
        assert f"psrv{net}-h1" not in _netns(), "the killed launcher's hosts were removed"
        assert (CLAIMS / f"{net}.owner").exists() == (hosts.names.net == net), "and its claim taken back"
        assert hosts.namespace(0) in _netns() and _link_up(hosts.bridge)
    assert not _link_up(hosts.bridge) and hosts.namespace(0) not in _netns()
