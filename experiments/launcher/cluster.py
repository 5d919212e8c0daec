"""The processes of one local run, started on 127.0.0.1 and stopped by PID: the launcher's mechanism
(experiments/launcher/launch.py for the parameter server, experiments/launcher/launch_ddp.py for the all-reduce baseline)."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from psrv.process import cores_each, usable_cores

from psrv.experiments.launcher.forkserver import FORKABLE, ForkServer, ForkServerGone

log = logging.getLogger("psrv.run")


class RunFailed(RuntimeError):
    """A process of the cluster failed; the message carries the tail of its log. `summary`: what the run wrote
    of what ran before it (summary.json, `complete` False, its `cause`), None where it wrote none."""

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, where the entry point makes it one) stopped a run after its processes were
    started: they were stopped, and what ran was written, marked incomplete. `summary` is that summary
    (`complete` False, `steps_done`), `interrupt` the KeyboardInterrupt that stopped it."""

    def __init__(self, summary: dict, interrupt: KeyboardInterrupt):
        super().__init__(f"interrupted after {summary['steps_done']} steps")
        self.summary, self.interrupt = summary, interrupt


def thread_env(processes: int) -> dict[str, str]:
    """OMP_NUM_THREADS for each of `processes` sharing this machine: the cores split evenly, as torchrun
    does for several ranks on a host (unless the caller set it; psrv.process.cores_each, the rule psrv
    serve and psrv worker started by hand follow too). Oversubscribed, torch's threads wait for a
    descheduled peer at every parallel op: on 2 cores DDP ran 2.1x, async PS 1.6x faster so."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(cores_each(processes))}


def idle_cores() -> int:
    """The cores this process may use less the 1-minute load average (other work's, at least one)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, usable_cores() - round(load))


def _die_with_launcher() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to send the child SIGTERM when the process that started it dies (kill -9
    included: a run's servers and workers must not go on writing into a folder whose run is gone). None
    where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl, launcher = libc.prctl, os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))
        if os.getppid() != launcher:  # it died before the request was made
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


class Cluster:
    """The processes of one run, each logging to DIR/<name>.log; stop() kills whatever is left, by PID.
    `processes`: how many will share the machine (each gets its share of the cores as torch threads).

    Each process runs in a session of its own, so a terminal's Ctrl-C reaches only the launcher, which
    then stops them in order (`interrupt`: the workers first, so they can leave and write their records).
    Each gets SIGTERM if the launcher dies (kill -9), and inherits `keep_fds` (the run folder's lock,
    experiments/launcher/rundir.py: the folder stays owned while any of them lives)."""

    def __init__(self, out: Path, *, processes: int = 1, hosts=None, keep_fds: tuple[int, ...] = (),
                 fork_server: bool = True):
        self.out = out
        self.keep_fds = keep_fds
        self.preexec = _die_with_launcher()
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = thread_env(processes)
        self.brief: dict[str, str] = {}  # processes whose failure is said in one line, as what they are
        self.explain: dict[str, Callable[[int], str]] = {}  # processes that say their failure themselves
        self.hosts = hosts  # experiments/launcher/netns.EmulatedHosts, experiments/launcher/slurm.SlurmAllocation: where each runs
        self.host_of: dict[str, int] = {}
        self.recover: Callable[[Cluster, str], bool] | None = None  # a failed process's second chance
        self.spared: set[str] = set()  # processes whose death the run expects (killed on purpose): no failure
        # Started at the first psrv process where the run has more processes than idle cores: one import of
        # torch instead of one per process. Side by side on idle cores they import as fast as one does before
        # forking (faster by its preloads); on cores busy with other work each import takes CPU from the rest.
        # False: each starts itself
        self._forks: ForkServer | None | bool = None if fork_server and processes > idle_cores() else False

    def start(self, name: str, argv: list[str], env: dict | None = None, *, brief: str = "",
              host: int | None = None, explain: Callable[[int], str] | None = None) -> subprocess.Popen:
        """Start `name` (its output to DIR/<name>.log). `brief`: what it is (e.g. "rank 1 (train.py)"); its
        failure is then one line naming it, its exit code, its last line of output and its log. `explain`:
        for a process whose log says more (a launcher of several ranks), its exit code -> that one line.
        `host`: with emulated hosts, the one it runs on (its address: `address(host)`)."""
        full_env = {**os.environ, **self.env, **(env or {}), "PYTHONUNBUFFERED": "1"}
        proc = None
        if self.hosts is not None and host is not None:
            self.host_of[name] = host
            netns = getattr(self.hosts, "netns", None)  # an emulated host, entered by the forked child itself
            proc = self._forked(argv, full_env, name, netns=netns(host)) if netns else None
            if proc is None:
                argv = self.hosts.wrap(host, argv, name=name)
        elif self.hosts is None:
            proc = self._forked(argv, full_env, name)
        if proc is None:
            log = open(self.out / f"{name}.log", "w")
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=full_env, **self._popen_options())
            log.close()
        self.procs[name] = proc
        if brief:
            self.brief[name] = brief
        if explain is not None:
            self.explain[name] = explain
        return proc

    def _popen_options(self) -> dict:
        return {"start_new_session": True, "pass_fds": self.keep_fds, "preexec_fn": self.preexec}

    def _forked(self, argv: list[str], env: dict[str, str], name: str, *, netns: str = ""):
        """`argv`, a `python -P -m psrv.cli` or an all-reduce rank's `python -P -m psrv.workers.allreduce` on this
        machine (in the network namespace `netns`, an emulated host's), forked from the run's fork server
        (experiments/launcher/forkserver.py), started first; None where it cannot be (another command, or a fork
        server that would not start: it said why in its log)."""
        if self._forks is False or argv[:3] != [sys.executable, "-P", "-m"] or len(argv) < 4 \
                or argv[3] not in FORKABLE:
            return None
        try:
            if self._forks is None:
                self._forks = ForkServer(env, self._popen_options(), log=str(self.out / "forkserver.log"))
            return self._forks.start(argv, env, str(self.out / f"{name}.log"), netns=netns)
        except (ForkServerGone, OSError) as exc:
            log.warning("starting the run's processes one by one: the fork server failed (%s)", exc)
            if self._forks:
                self._forks.close()
            self._forks = False
            return None

    def failed(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() not in (None, 0) and name not in self.spared:
                return name
        return None

    def tail(self, name: str, lines: int = 15) -> str:
        text = (self.out / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def failure(self, name: str) -> str:
        """Why process `name` (ended) failed: RunFailed's message, its first line what happened (a run's `cause`)."""
        code, log = self.procs[name].returncode, self.out / f"{name}.log"
        if name in self.explain:
            return self.explain[name](code)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if name not in self.brief:
            return f"{name} {how}; its output: {log}\nits last lines:\n{self.tail(name)}"
        theirs = getattr(self.hosts, "own_lines", ())  # what the scheduler says about it, not what it said
        last = next((line.strip() for line in reversed(self.tail(name).splitlines())
                     if line.strip() and not line.startswith(theirs)), "")
        return f"{self.brief[name]} {how}{f' ({last})' if last else ''}; its output: {log}"

    def check(self) -> None:
        """RunFailed if any process has failed and `recover` (name -> whether it started it again under
        the same name: experiments/launcher/kills.py ShardRestarts) did not bring it back."""
        while True:
            bad = self.failed()
            if not bad:
                return
            if self.recover is None or not self.recover(self, bad):
                raise RunFailed(self.failure(bad))

    def stop(self) -> None:
        """SIGTERM to every process still running, then SIGKILL to any left after 5 s."""
        running = {n: p for n, p in self.procs.items() if p.poll() is None}
        self._signal(list(running), signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in running.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._forks:
            self._forks.close()
            self._forks = None

    def interrupt(self, names: list[str], *, grace: float = 3.0) -> None:
        """Send SIGINT to `names` still running and give them up to `grace` seconds to end (a worker
        leaves its shards and writes its record); stop() then ends whatever is left."""
        running = {n: self.procs[n] for n in names if n in self.procs and self.procs[n].poll() is None}
        self._signal(list(running), signal.SIGINT)
        deadline = time.monotonic() + grace
        for proc in running.values():
            try:
                proc.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def _signal(self, names: list[str], signum: int) -> None:
        """`signum` to the processes `names`: through the scheduler where it runs them (a SLURM step's
        task is not the srun process here), else to each process."""
        if getattr(self.hosts, "signal", None) is not None:
            self.hosts.signal(names, signum)
            return
        for name in names:
            self.procs[name].send_signal(signum)

    def wait(self, names: list[str], *, timeout: float, tick: Callable[[], None] = lambda: None) -> None:
        deadline = time.monotonic() + timeout
        while any(self.procs[n].poll() is None for n in names):
            self.check()
            if time.monotonic() > deadline:
                raise RunFailed(f"run did not finish within {timeout:.0f}s; see the logs in {self.out}")
            tick()
            time.sleep(0.2)
        self.check()


    def address(self, host: int) -> str:
        """The IP address process `host` listens on: its emulated host's, else 127.0.0.1."""
        return self.hosts.address(host) if self.hosts is not None else "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a rendezvous's, bound later by another process).

    Drawn at random below the kernel's ephemeral range, not from it (bind to port 0): a port from that
    range, released here, is what the next outgoing connection of any process may take as its source
    port before the rendezvous binds it (EADDRINUSE in torch's TCPStore, seen with two runs at once),
    and two launchers drawing at random rarely draw the same one."""
    low = _ephemeral_low()
    for _ in range(100):
        port = random.randrange(10000, low) if low > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free TCP port on 127.0.0.1 below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
