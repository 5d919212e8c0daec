"""A local cluster of real processes on 127.0.0.1: servers and workers started together; `psrv run` calls this."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from psrv.config import RUN_MODES, FaultConfig, OptimConfig

from experiments.summary import build_summary, write_tables


class RunFailed(RuntimeError):
    """A process of the cluster failed; the message carries the tail of its log."""


@dataclass(frozen=True)
class RunOptions:
    servers: int = 2
    workers: int = 2
    mode: str = "ssp"
    staleness: int = 2
    backup_workers: int = 0
    job: str = "digits_mlp"
    steps: int = 300
    batch_size: int = 32
    seed: int = 0
    eval_every: int = 0
    optim: OptimConfig = field(default_factory=OptimConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    device: str = "cpu"
    transport: str = "zmq"
    wire_dtype: str = "float32"
    overlap: bool = True
    worker_timeout: float = 10.0
    metrics: bool = False
    metrics_linger: float = 0.0
    out: Path = Path("runs/latest")
    timeout: float = 1800.0

    def __post_init__(self) -> None:
        if self.mode not in RUN_MODES:
            raise ValueError(f"mode must be one of {', '.join(RUN_MODES)}; got {self.mode!r}")
        if self.servers < 1 or self.workers < 1:
            raise ValueError(f"need at least one server and one worker; got {self.servers} and {self.workers}")
        if self.wire_dtype != "float32" and self.mode == "ddp":
            raise ValueError("wire_dtype is for the parameter server's pushes; the DDP baseline all-reduces float32")


def run_options_from_args(a: argparse.Namespace) -> RunOptions:
    from psrv.cli import fault_config, optim_config
    return RunOptions(servers=a.servers, workers=a.workers, mode=a.mode, staleness=a.staleness,
                      backup_workers=a.backup_workers, job=a.job, steps=a.steps, batch_size=a.batch_size,
                      seed=a.seed, eval_every=a.eval_every, optim=optim_config(a), faults=fault_config(a),
                      device=a.device, transport=a.transport, wire_dtype=a.wire_dtype, overlap=a.overlap,
                      worker_timeout=a.worker_timeout, metrics=a.metrics, metrics_linger=a.metrics_linger, out=a.out)


def _psrv(*args: str) -> list[str]:
    return [sys.executable, "-m", "psrv.cli", *args]


def _optim_flags(o: RunOptions) -> list[str]:
    flags = ["--optimizer", o.optim.name, "--lr", repr(o.optim.lr), "--momentum", repr(o.optim.momentum),
             "--weight-decay", repr(o.optim.weight_decay)]
    return flags + (["--nesterov"] if o.optim.nesterov else [])


def worker_flags(o: RunOptions, rank: int) -> list[str]:
    f = o.faults
    return ["--rank", str(rank), "--world-size", str(o.workers), "--job", o.job, "--steps", str(o.steps),
            "--batch-size", str(o.batch_size), "--seed", str(o.seed), "--eval-every", str(o.eval_every),
            "--device", o.device, "--compute-ms", repr(f.compute_ms), "--straggler", f.straggler,
            "--transient-stragglers", f.transient_stragglers, "--net-delay-ms", repr(f.net_delay_ms),
            "--wire-dtype", o.wire_dtype] + ([] if o.overlap else ["--no-overlap"])


def thread_env(processes: int) -> dict[str, str]:
    """OMP_NUM_THREADS for each of `processes` sharing this machine: the cores split evenly, as torchrun
    does for several ranks on a host (unless the caller set it). Oversubscribed, torch's threads wait
    for a descheduled peer at every parallel op: on 2 cores DDP ran 2.1x, async PS 1.6x faster so."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes))}


class Cluster:
    """The processes of one run, each logging to DIR/<name>.log; stop() kills whatever is left, by PID.
    `processes`: how many will share the machine (each gets its share of the cores as torch threads)."""

    def __init__(self, out: Path, *, processes: int = 1):
        self.out = out
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = thread_env(processes)

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.out / f"{name}.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **self.env, **(env or {}), "PYTHONUNBUFFERED": "1"})
        log.close()
        self.procs[name] = proc
        return proc

    def failed(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() not in (None, 0):
                return name
        return None

    def tail(self, name: str, lines: int = 15) -> str:
        text = (self.out / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wait(self, names: list[str], *, timeout: float, tick: Callable[[], None] = lambda: None) -> None:
        deadline = time.monotonic() + timeout
        while any(self.procs[n].poll() is None for n in names):
            bad = self.failed()
            if bad:
                raise RunFailed(f"{bad} exited with code {self.procs[bad].returncode}; "
                                f"last lines of {self.out / (bad + '.log')}:\n{self.tail(bad)}")
            if time.monotonic() > deadline:
                raise RunFailed(f"run did not finish within {timeout:.0f}s; see the logs in {self.out}")
            tick()
            time.sleep(0.2)
        bad = self.failed()
        if bad:
            raise RunFailed(f"{bad} exited with code {self.procs[bad].returncode}; "
                            f"last lines of {self.out / (bad + '.log')}:\n{self.tail(bad)}")


def run_local(o: RunOptions, *, progress: bool = True, on_progress: Callable[[int], None] | None = None) -> dict:
    """Run the job on a local cluster; write DIR/summary.json, steps.csv, evals.csv and return the summary.

    on_progress(steps done by all workers so far) is called while it runs (for an outer progress bar)."""
    o.out.mkdir(parents=True, exist_ok=True)
    for stale in o.out.glob("*.json"):
        stale.unlink()
    cluster = Cluster(o.out, processes=o.workers + (o.servers if o.mode != "ddp" else 0))
    try:
        if o.mode == "ddp":
            from experiments.launch_ddp import start_ddp
            names = start_ddp(cluster, o)
            servers = []
        else:
            servers = _start_servers(cluster, o)
            names = _start_workers(cluster, o, [a for _, a in servers])
        bar = _progress(o, enabled=progress, on_update=on_progress)
        expected = o.servers + o.workers if o.metrics and o.mode != "ddp" else 0
        found = [0]

        def tick() -> None:
            bar.tick()
            if found[0] < expected:  # processes announce their /metrics ports as they start
                found[0] = write_targets(o.out)
        cluster.wait(names, timeout=o.timeout, tick=tick)
        cluster.wait([n for n, _ in servers], timeout=60)
        bar.close()
    finally:
        cluster.stop()
    summary = build_summary(o, o.out)
    write_tables(o.out)
    (o.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _metrics_flags(o: RunOptions) -> list[str]:
    return ["--metrics-port", "0", "--metrics-linger", repr(o.metrics_linger)] if o.metrics else []


def write_targets(out: Path) -> int:
    """DIR/targets.json in Prometheus file_sd format, from the ports the processes announced."""
    groups = []
    for role in ("server", "worker"):
        ports = sorted(out.glob(f"{role}-*.metrics"))
        targets = [f"127.0.0.1:{p.read_text().strip()}" for p in ports if p.read_text().strip()]
        if targets:
            groups.append({"targets": targets, "labels": {"job": "psrv", "role": role}})
    tmp = out / "targets.json.tmp"
    tmp.write_text(json.dumps(groups, indent=1))
    tmp.replace(out / "targets.json")
    return sum(len(g["targets"]) for g in groups)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_servers(cluster: Cluster, o: RunOptions) -> list[tuple[str, str]]:
    names = []
    rpc_master = f"127.0.0.1:{_free_port()}" if o.transport == "rpc" else ""  # shard 0 hosts the rendezvous
    for i in range(o.servers):
        ready = o.out / f"server-{i}.addr"
        ready.unlink(missing_ok=True)
        argv = _psrv("serve", "--bind", "tcp://127.0.0.1:0", "--shard", str(i), "--num-shards", str(o.servers),
                     "--workers", str(o.workers), "--mode", o.mode, "--staleness", str(o.staleness),
                     "--backup-workers", str(o.backup_workers), *_optim_flags(o), "--device", o.device,
                     "--transport", o.transport, "--worker-timeout", repr(o.worker_timeout),
                     "--out", str(o.out / f"server-{i}.json"), "--ready-file", str(ready))
        argv += _metrics_flags(o) + (["--rpc-master", rpc_master] if rpc_master else [])
        cluster.start(f"server-{i}", argv)
        names.append((f"server-{i}", ready))
    if rpc_master:  # the RPC world forms only once the workers join it too: do not wait for the servers
        return [(n, f"rpc://{rpc_master}/server-{i}") for i, (n, _) in enumerate(names)]
    # Workers start at once and read each address from the server's ready file when it appears
    # (psrv worker --servers @FILE), so their start-up overlaps the servers'.
    return [(n, f"@{r}") for n, r in names]


def _start_workers(cluster: Cluster, o: RunOptions, addresses: list[str]) -> list[str]:
    names = []
    for rank in range(o.workers):
        argv = _psrv("worker", "--servers", ",".join(addresses), *worker_flags(o, rank),
                     "--transport", o.transport, "--out", str(o.out / f"worker-{rank}.json"),
                     "--progress-file", str(o.out / f"worker-{rank}.progress"))
        if rank == 0:
            argv += ["--params-out", str(o.out / "params.pt")]
        argv += _metrics_flags(o) + ["--mode", o.mode]
        cluster.start(f"worker-{rank}", argv)
        names.append(f"worker-{rank}")
    return names


class _progress:
    """A tqdm bar over all workers' steps, fed by the workers' logs of completed steps."""

    def __init__(self, o: RunOptions, *, enabled: bool, on_update: Callable[[int], None] | None = None):
        self.o = o
        self.on_update = on_update
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=o.steps * o.workers, desc=f"{o.mode} x{o.workers}", unit="step", leave=False)

    def tick(self) -> None:
        if self.bar is None and self.on_update is None:
            return
        done = 0
        for rank in range(self.o.workers):
            p = self.o.out / f"worker-{rank}.progress"
            try:
                done += int(p.read_text() or 0)
            except (FileNotFoundError, ValueError):
                pass
        if self.on_update is not None:
            self.on_update(done)
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
