"""A run's processes as SLURM job steps: `psrv run|experiment --scheduler slurm`.

Each process psrv would start on 127.0.0.1 (a shard, a worker, a script's rank, an all-reduce rank) is
instead one `srun` job step of a single allocation, one task each. The allocation is the run's own
(held by salloc while the run goes, released at the end whatever happened, a lost launcher included), or the one psrv itself runs in
(SLURM_JOB_ID set, e.g. `sbatch --wrap "psrv experiment ..."`: its steps are stopped, the job is left to
its owner).

Why srun steps and not sbatch (TorchX, the issue's engine of choice, is not a dependency here): the
launcher must see each process end as it ends, with its exit code, to stop a run at the first failed rank;
its output must land in DIR/<name>.log as it is written; and Ctrl-C must reach each worker as SIGINT so
that it leaves its shards and writes what it did. srun is a foreground process that relays its task's
output and exit code, and `scancel --signal` reaches one step. sbatch would need polling squeue and
files for all three. One allocation per run keeps the run one job in squeue and sacct, with a step per
process named after it (server-0, worker-1, ...), and tells the launcher the nodes before any process
starts: process i runs on node i mod the allocation's nodes, so a server's bind address and the
all-reduce rendezvous (MASTER_ADDR) are known up front, as with emulated hosts (experiments/launcher/netns.py).

The run folder must be on a filesystem every node shares: the servers publish their addresses there
(`psrv serve --ready-file`, read by the workers as `--servers @FILE`) and each process writes its
record there. The allocation's size, partition, account and time limit follow SLURM's own input
variables (SALLOC_PARTITION, SALLOC_ACCOUNT, SALLOC_TIMELIMIT, ...), as with salloc by hand.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from psrv.experiments.launcher.cluster import RunFailed

_TOOLS = ("salloc", "srun", "squeue", "scancel", "scontrol")


def unavailable() -> str | None:
    """Why SLURM cannot start processes from here, in one line (None: it can)."""
    gone = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if gone:
        return (f"{', '.join(gone)} not found on PATH; install SLURM's client commands (Debian: slurm-client) "
                "or run with --scheduler local")
    return None


class SlurmAllocation:
    """The nodes `processes` processes run on, as one SLURM job; a Cluster's `hosts` (experiments/launcher/cluster.py).

    On entry: the allocation (its own, or the enclosing one), and its node list. `wrap(host, argv, name)`
    makes argv a job step on host's node; `signal(names, signum)` delivers a signal to the steps of those
    names; on exit the steps still running are cancelled and the run's own allocation released.
    RunFailed, in one line, where SLURM refuses."""

    gloo_interface = None  # gloo finds each node's interface from its hostname
    own_lines = ("srun: ", "slurmstepd")  # SLURM's own lines in a step's output (a process's last line is not one)

    def __init__(self, processes: int, *, name: str, timeout: float):
        self.processes, self.name, self.timeout = processes, name, timeout
        self.job_id, self.nodes, self.addresses = "", [], []
        self.holder: subprocess.Popen | None = None  # salloc, holding the run's own allocation

    def __enter__(self) -> SlurmAllocation:
        enclosing = os.environ.get("SLURM_JOB_ID")
        self.job_id = enclosing or self._allocate()
        try:
            self.nodes = self._nodes()
            self.addresses = [socket.gethostbyname(node) for node in self.nodes]
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.holder is not None:  # the run's own allocation: released, every step it holds ends with it
            self.holder.stdin.close()
            try:
                self.holder.wait(30)
            except subprocess.TimeoutExpired:
                _scancel(self.job_id)
                self.holder.kill()
                self.holder.wait()
            self.holder.stderr.close()
        elif self.job_id:
            for step in self._steps().values():
                _scancel(step)

    def _allocate(self) -> str:
        """A new allocation for this run, held by `salloc ... cat` for as long as its stdin, our pipe, is
        open: closing it (or this process dying, kill -9 included) ends cat, and salloc then releases the
        allocation, which ends COMPLETED. Waits in SLURM's queue as salloc does; Ctrl-C while it waits
        withdraws the request (salloc's own SIGINT handling). Its job id."""
        argv = ["salloc", f"--ntasks={self.processes}", "--overcommit", f"--job-name={self.name}"]
        if "SALLOC_TIMELIMIT" not in os.environ:  # the run's timeout and a margin: an upper bound on any mishap
            argv.append(f"--time={math.ceil(self.timeout / 60) + 2}")
        self.holder = subprocess.Popen([*argv, "cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True)
        said = []
        try:
            for line in self.holder.stderr:
                said.append(line.strip())
                granted = re.search(r"Granted job allocation (\d+)", line)
                if granted:
                    return granted.group(1)
        except BaseException:
            self.holder.send_signal(signal.SIGINT)
            self.holder.wait(30)
            raise
        self.holder.stdin.close()
        code = self.holder.wait(30)
        raise RunFailed(f"--scheduler slurm: salloc failed (exit code {code}): {(said or ['no output'])[-1]}")

    def _nodes(self) -> list[str]:
        nodelist = _run("squeue", "--noheader", "--jobs", self.job_id, "--format", "%N").strip()
        if not nodelist:
            raise RunFailed(f"--scheduler slurm: job {self.job_id} has no nodes (squeue shows none)")
        return _run("scontrol", "show", "hostnames", nodelist).split()

    def _steps(self, names: list[str] | None = None) -> dict[str, str]:
        """{step name: step id (JOB.STEP)} of this job's running steps, those named `names` if given."""
        try:
            text = _run("squeue", "--steps", "--noheader", "--jobs", self.job_id, "--format", "%i %j")
        except RunFailed:
            return {}
        steps = dict(reversed(line.split(maxsplit=1)) for line in text.splitlines() if len(line.split()) == 2)
        return {n: s for n, s in steps.items() if names is None or n in names}

    def node(self, host: int) -> str:
        return self.nodes[host % len(self.nodes)]

    def address(self, host: int) -> str:
        """The IP address of host's node: what its server binds, and the all-reduce rendezvous host."""
        return self.addresses[host % len(self.addresses)]

    def wrap(self, host: int, argv: list[str], *, name: str = "") -> list[str]:
        """`argv` as a job step of one task on host's node, named `name`. --overlap: the run's steps share
        the allocation's CPUs, as the processes of a local run share the machine."""
        step = ["srun", f"--jobid={self.job_id}", "--nodes=1", "--ntasks=1", "--overlap", "--quiet",
                f"--nodelist={self.node(host)}", "--kill-on-bad-exit=0"]
        return [*step, *([f"--job-name={name}"] if name else []), *argv]

    def signal(self, names: list[str], signum: int, *, wait: float = 2.0) -> None:
        """Deliver `signum` to the running steps named `names` (a signal to srun itself would not reach the
        task: SIGTERM makes srun kill it, a lone SIGINT only prints its status). A step just started may not
        be listed yet: up to `wait` seconds are given for every named one to appear."""
        deadline = time.monotonic() + wait
        steps = self._steps(names)
        while len(steps) < len(names) and time.monotonic() < deadline:
            time.sleep(0.2)
            steps = self._steps(names)
        for step in steps.values():
            _scancel(step, f"--signal={signal.Signals(signum).name}")


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RunFailed(f"--scheduler slurm: {' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _scancel(target: str, *options: str) -> None:
    """scancel a job or a step; one that has ended already is no error."""
    subprocess.run(["scancel", "--quiet", *options, target], capture_output=True, timeout=60)


def job_name(out: Path) -> str:
    """The run's job name in squeue and sacct: psrv-<variant>-rep-<k> in an experiment, psrv-<folder> else."""
    parts = [out.parent.name, out.name] if out.name.startswith("rep-") else [out.name]
    return "-".join(["psrv", *parts])[:64]
