"""`psrv run --launcher torchrun --script FILE.py ARGS`: a script's workers started as one torchrun process.

torchrun (`python -m torch.distributed.run`) starts `--nproc-per-node` copies of the script with RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, the same argv and the same environment otherwise,
as it would on a GPU host; psrv.Worker reads RANK and WORLD_SIZE from there and its record paths from the
`{rank}` templates experiments/launcher/script.py sets. Its rendezvous is static on 127.0.0.1, at a port drawn by
`free_port` (below the ephemeral range, where `--standalone`'s bind to port 0 could take one an outgoing
connection is about to use). One attempt (`--max-restarts 0`): a rank that fails fails the run.

Its output goes to DIR/workers.log, each line of rank R's prefixed `[workerR]:` (`--role worker --tee 3`);
torchrun's own per-rank copies are under DIR/torchrun/. Ctrl-C reaches the torchrun process, which hands
SIGINT on to every rank: each leaves the shards and writes what it did, as under the psrv launcher.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from psrv.config import RunConfig

from psrv.experiments.launcher.cluster import Cluster, free_port
from psrv.experiments.launcher.script import Script, script_env

LAUNCHERS = ("psrv", "torchrun")  # how a run's workers are started; not part of what it computes
NAME = "workers"  # the torchrun process, and its log DIR/workers.log
ROLE = "worker"   # torchrun's role name: rank R's lines read [workerR]:
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def check_launcher(launcher: str, script: Script | None, mode: str = "sync", *, hosts: str = "") -> None:
    """ValueError, naming --launcher, for a launcher psrv does not have or one that cannot start this run
    (`hosts`: what puts each process on an emulated host of its own, e.g. "--bandwidth 200mbit"; "" none)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"--launcher: unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    if launcher == "torchrun" and (script is None or mode not in ("sync", "async", "ssp")):
        raise ValueError("--launcher torchrun: starts a --script's workers against shards (sync, async, ssp); "
                         "the shipped loop and the all-reduce modes use --launcher psrv")
    if launcher == "torchrun" and hosts:
        raise ValueError(f"--launcher torchrun: starts every rank as one process, on one host, and {hosts} puts "
                         "each rank on an emulated host of its own; use --launcher psrv")


def torchrun_argv(cfg: RunConfig, out: Path, script: Script, port: int) -> list[str]:
    """One torchrun process for all cfg.cluster.workers ranks of `script`, its rendezvous on 127.0.0.1:port."""
    return [sys.executable, "-P", "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(cfg.cluster.workers), "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--max-restarts", "0", "--role", ROLE, "--tee", "3", "--log-dir", str(out / "torchrun"), *script.argv]


def start_torchrun_workers(cluster: Cluster, cfg: RunConfig, out: Path, script: Script,
                           servers: list[tuple[str, str]], *, metrics: bool, linger: float) -> list[str]:
    """Start the torchrun process (named NAME); return [NAME], the process to wait for."""
    env = script_env(cfg, out, script, ",".join(address for _, address in servers), metrics=metrics, linger=linger)
    cluster.start(NAME, torchrun_argv(cfg, out, script, free_port()), env=env,
                  explain=lambda code: torchrun_failure(out / f"{NAME}.log", script, code))
    return [NAME]


def torchrun_failure(log: Path, script: Script, code: int) -> str:
    """Why the torchrun process failed, in one line: the rank torchrun names as the root cause, its exit
    code and its last line of output, else torchrun's own exit code and last line."""
    text = log.read_text(errors="replace") if log.exists() else ""
    cause = _ROOT_CAUSE.search(text)
    if cause is None:
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
        return f"torchrun ({script.path}) exited with code {code}{f' ({last})' if last else ''}; its output: {log}"
    rank, exit_code = int(cause.group(1)), int(cause.group(2))
    prefix = f"[{ROLE}{rank}]:"
    mine = [line[len(prefix):].strip() for line in text.splitlines() if line.startswith(prefix)]
    last = next((line for line in reversed(mine) if line), "")
    how = f"was killed by signal {-exit_code}" if exit_code < 0 else f"exited with code {exit_code}"
    return (f"rank {rank} ({script.path}, under torchrun) {how}{f' ({last})' if last else ''}; "
            f"its output: {log} (lines {prefix})")


def rank_output(out: Path, launcher: str):
    """Where rank R's output goes under `launcher`: a function of R."""
    if launcher == "torchrun":
        return lambda rank: out / f"{NAME}.log"
    return lambda rank: out / f"worker-{rank}.log"
