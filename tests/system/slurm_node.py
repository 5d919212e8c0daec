"""A real one-node SLURM for the tests: munged, slurmctld and slurmd on this machine, every file of theirs
in a folder of the test's own, stopped by PID at the end.

Nothing under /etc, /run or /var is written: the daemons take their config, key, socket, spool, logs and
ports from the folder (SLURM_CONF points the client commands at it), so nothing needs restoring and a
SLURM already set up on the machine is left alone. Skipped only where the SLURM binaries are missing
(.ci/run installs them) or the tests do not run as root (slurmd starts every step's processes as their
owner). Config as in SLURM's single-node recipes: proctrack/linuxproc and task/none, so no cgroups or
systemd; one node with the machine's CPUs, each shared by up to 8 jobs.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from psrv.experiments.launcher.cluster import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "squeue", "salloc", "srun", "scancel", "scontrol")


@dataclass
class SlurmNode:
    """The running node: `env` (SLURM_CONF) for every command that talks to it, its folder and logs."""

    root: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def jobcomp(self) -> Path:
        """SLURM's job completion log (jobcomp/filetxt): one line per finished job."""
        return self.root / "log" / "jobcomp.txt"

    def run(self, *argv: str) -> str:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=True).stdout

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted((self.root / "log").glob("*")) if p.is_file())


def _skip_unless_available() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: slurmd runs each step's processes as their owner")
    gone = [b for b in DAEMONS + CLIENTS if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if gone:
        pytest.skip(f"SLURM is not installed ({', '.join(gone)} missing; .ci/run installs slurmctld, slurmd, "
                    "slurm-client and munge)")


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _write_config(root: Path, host: str) -> Path:
    ctld_port, d_port = free_port(), free_port()
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=psrvtest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/socket
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={root}/spool/ctld
SlurmdSpoolDir={root}/spool/d
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
ReturnToService=2
NodeName={host} CPUs={os.cpu_count() or 1} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
""")
    return conf


def _start(node: SlurmNode, name: str, argv: list[str]) -> None:
    with open(node.root / "log" / f"{name}.out", "w") as out:
        node.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=node.env, start_new_session=True)


def _wait_idle(node: SlurmNode, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        for name, proc in node.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}\n{node.logs()}")
        done = subprocess.run(["sinfo", "--noheader", "--format", "%t"], env=node.env, capture_output=True,
                              text=True, timeout=10)
        state = done.stdout.strip()
        if state == "idle":
            return
        time.sleep(0.3)
    raise RuntimeError(f"the SLURM node is not idle after {timeout:.0f}s (sinfo: {state!r})\n{node.logs()}")


def _stop(node: SlurmNode) -> None:
    """Cancel what is left on the node, then stop slurmd, slurmctld and munged, each by its PID."""
    subprocess.run(["scancel", "--quiet", "--user", "root"], env=node.env, capture_output=True, timeout=30)
    for name in ("slurmd", "slurmctld", "munged"):
        proc = node.procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def slurm_node(tmp_path_factory):
    """A one-node SLURM, idle, for the module's tests; stopped by PID at the end whatever happened."""
    _skip_unless_available()
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "spool/ctld", "spool/d", "log"):
        (root / sub).mkdir(parents=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = _write_config(root, socket.gethostname().split(".")[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_"))}
    node = SlurmNode(root, {**env, "SLURM_CONF": str(conf)})
    try:
        munge = root / "munge"
        _start(node, "munged", [_binary("munged"), "--foreground", "--force", f"--key-file={key}",
                                f"--socket={munge}/socket", f"--pid-file={munge}/munged.pid",
                                f"--log-file={root}/log/munged.log", f"--seed-file={munge}/seed"])
        deadline = time.monotonic() + 10
        while not (munge / "socket").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        _start(node, "slurmctld", [_binary("slurmctld"), "-D", "-f", str(conf)])
        _start(node, "slurmd", [_binary("slurmd"), "-D", "-f", str(conf)])
        _wait_idle(node)
        yield node
    finally:
        _stop(node)
