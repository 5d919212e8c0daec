"""failover: seconds from a kill -9 of a replicated shard's primary to the first push its successor acknowledges,
over many kills of one long run (docs/reliability.md, "Failover, and its bound").

python -m psrv.experiments.bench.replicas --kills 100 [--failure-bound 0.5]

One shard (async, one worker) with a backup, both `psrv serve` processes given the same --witness. The bench
kills the current primary (the witness's highest epoch names it) between two of the worker's steps, times the
next step(), whose push only the new primary can acknowledge, then starts a new backup, waits until it follows
the new primary and the worker has heard of it (a reply names it), and kills again. Every replica is forked
from a forkserver that imported torch and psrv once, so a kill costs a fork, not a torch import, and the run
of 100 kills takes a few minutes on 2 cores. Each kill's phases are kept too: the backup's claim on the witness
(the epoch file's time), the worker's move to it (its client's log line), its first acknowledged push.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from psrv.config import ServerConfig
from psrv.server.replication.witness import Witness

P99_GOAL = 2.0  # seconds; the median's goal is the row's (experiments/bench/__main__.py)
PRELOAD = ["torch", "psrv.server.run"]  # what every replica would import, once for all


def _replica(cfg: ServerConfig, ready: Path, log_path: str) -> None:
    """A forked replica (the forkserver's child) serving as `psrv serve` does (psrv.server.run.serve): its log
    to `log_path`, its address to `ready` once bound (a backup's: once it follows)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s")
    from psrv.server.run import serve
    serve(cfg, ready_file=ready)


class _Moves(logging.Handler):
    """When the worker's client moved a shard to another replica (its WARNING "trying its replica")."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.at: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "trying its replica" in record.getMessage():
            self.at.append(time.monotonic())


@dataclass
class Kill:
    seconds: float     # the kill to the first push acknowledged after it
    claimed: float     # the kill to the backup's claim of the next epoch on the witness (wall clock)
    moved: float | None  # the kill to the worker's client moving to another replica (None: it did not)


class Shard:
    """One replicated shard's processes, forked from a forkserver, and its witness."""

    def __init__(self, folder: Path, bound: float):
        self.folder, self.bound = folder, bound
        self.witness = Witness(folder / "witness", 0)
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)
        self.procs: dict[str, multiprocessing.Process] = {}  # address -> process
        self.started = 0

    def start(self, backup_of: str = "") -> str:
        """Fork a replica (a backup of `backup_of`: its address once it follows) and return its address."""
        self.started += 1
        name = f"replica-{self.started}"
        ready = self.folder / f"{name}.addr"
        cfg = ServerConfig(workers=1, mode="async", witness=str(self.folder / "witness"), failure_bound=self.bound,
                           backup_of=backup_of)
        proc = self.ctx.Process(target=_replica, args=(cfg, ready, str(self.folder / f"{name}.log")), daemon=True)
        proc.start()
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text().strip()):
            if not proc.is_alive() or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{name} did not start (or follow); see {self.folder / f'{name}.log'}")
            time.sleep(0.01)
        address = ready.read_text().strip()
        self.procs[address] = proc
        return address

    def kill_primary(self) -> tuple[float, float]:
        """SIGKILL the primary the witness names: (monotonic, wall) time of the kill."""
        latest = self.witness.latest()
        proc = self.procs.pop(latest.primary)
        at, wall = time.monotonic(), time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        return at, wall

    def claimed_after(self, epoch: int) -> float | None:
        """The wall-clock time of the first claim above `epoch` (a backup taking over), if any yet."""
        config = self.witness.read(epoch + 1)
        return config.at if config is not None else None

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.join()


def run(kills: int, *, bound: float = 1.0, steps_between: int = 5) -> dict:
    """The failover row: `kills` kills of one shard's primary, at failure bound `bound`."""
    import torch

    import psrv
    load = os.getloadavg()[0]
    moves = _Moves()
    client_log = logging.getLogger("psrv.client.psclient")
    client_log.addHandler(moves)
    measured: list[Kill] = []
    with tempfile.TemporaryDirectory(prefix="psrv-failover-") as d:
        shard = Shard(Path(d), bound)
        try:
            primary = shard.start()
            shard.start(backup_of=primary)
            model = torch.nn.Linear(64, 64)
            with psrv.Worker(model, [primary], rank=0, world_size=1, timeout=60.0) as ps:
                def step() -> None:
                    model(torch.randn(8, 64)).square().mean().backward()
                    ps.step()
                for _ in range(steps_between):
                    step()
                for _ in range(kills):
                    epoch = shard.witness.latest().epoch
                    moves.at.clear()
                    killed, wall = shard.kill_primary()
                    step()
                    seconds = time.monotonic() - killed
                    claim = shard.claimed_after(epoch)
                    measured.append(Kill(seconds, (claim - wall) if claim else float("nan"),
                                         moves.at[0] - killed if moves.at else None))
                    # the new backup follows once started; the next reply names it, so the worker knows it
                    shard.start(backup_of=shard.witness.latest().primary)
                    for _ in range(steps_between):
                        step()
        finally:
            client_log.removeHandler(moves)
            shard.close()
    return {**row(measured, bound=bound), "load_average_at_start": load}


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def row(kills: list[Kill], *, bound: float) -> dict:
    seconds = [k.seconds for k in kills]
    claims = [k.claimed for k in kills if k.claimed == k.claimed]
    moved = [k.moved for k in kills if k.moved is not None]
    return {"bench": "failover", "kills": len(kills), "failure_bound": bound,
            "ratio": statistics.median(seconds), "median_seconds": statistics.median(seconds),
            "p90_seconds": _quantile(seconds, 0.9), "p99_seconds": _quantile(seconds, 0.99),
            "min_seconds": min(seconds), "max_seconds": max(seconds),
            "p99_goal": f"<= {P99_GOAL:g}", "p99_goal_met": _quantile(seconds, 0.99) <= P99_GOAL,
            "claim_median_seconds": statistics.median(claims) if claims else None,
            "moved_median_seconds": statistics.median(moved) if moved else None, "moved": len(moved),
            "load_average": list(os.getloadavg()), "seconds": seconds}
