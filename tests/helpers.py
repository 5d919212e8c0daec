"""Helpers for tests that start psrv processes on 127.0.0.1 and clean them up by PID."""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from psrv.experiments.launcher.forkserver import ZYGOTE, ForkServer, ForkServerGone
from psrv.protocol import decode
from psrv.transport.base import ServerTransport

ROOT = Path(__file__).resolve().parents[1]


def psrv_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "psrv.cli", *args]


class Procs:
    """Processes a test started; every one is killed by PID at teardown.

    Where the test process has a zygote (tests/conftest.py; PSRV_ZYGOTE), each `psrv ARGS` is forked from a fork
    server of the test's own, forked from it, as a run's processes are (experiments/launcher/forkserver.py): the
    same `psrv.cli.main(ARGS)` in a session of its own, its output to the log, without importing torch again
    (1.7 s of CPU a process, about 40 of them in the suite); `fresh=True`, or no zygote, starts
    `python -m psrv.cli ARGS` as a user would."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.started: list = []  # subprocess.Popen, or ForkedProcess with the same poll/wait/send_signal/kill
        self.forks: ForkServer | None = None
        self._tried = False

    def _fork_server(self) -> ForkServer | None:
        if not self._tried and os.environ.get(ZYGOTE):
            self._tried = True
            try:
                self.forks = ForkServer(dict(os.environ), {}, log=str(self.tmp / "fork-server.log"))
            except ForkServerGone:
                self.forks = None
        return self.forks

    def start(self, name: str, *args: str, fresh: bool = False):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        forks = None if fresh else self._fork_server()
        if forks is not None and forks.alive():
            p = forks.start([sys.executable, "-P", "-m", "psrv.cli", *args], env, str(self.tmp / f"{name}.log"),
                            cwd=str(ROOT))
        else:
            with open(self.tmp / f"{name}.log", "w") as log:
                p = subprocess.Popen(psrv_argv(*args), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                     start_new_session=True)
        p.name = name
        self.started.append(p)
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def wait(self, p: subprocess.Popen, timeout: float) -> int:
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{p.name} still running after {timeout}s; log:\n{self.log(p.name)[-3000:]}")

    def server(self, name: str, *args: str, timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
        """Start `psrv serve` on a free 127.0.0.1 port; return (process, address) once it listens."""
        ready = self.tmp / f"{name}.addr"
        p = self.start(name, "serve", "--bind", "tcp://127.0.0.1:0", "--ready-file", str(ready), *args)
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start; log:\n{self.log(name)}")
            time.sleep(0.05)
        return p, ready.read_text().strip()

    def kill_all(self) -> None:
        for p in self.started:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        if self.forks is not None:
            self.forks.close()


def run_in_session(argv: list[str], *, timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run argv in its own process group. On timeout it gets SIGTERM first, so a `psrv run` stops the
    processes it started (each in a session of its own) by PID, then the whole group is killed."""
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            out, _ = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        raise AssertionError(f"{argv[3:5]} still running after {timeout}s:\n{out[-3000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return subprocess.CompletedProcess(argv, p.returncode, out, "")


def psrv_run(out: Path, *args: str, timeout: float = 180.0) -> dict:
    """`psrv run ... --out out` as a subprocess; its summary.json (fails the test on a non-zero exit)."""
    proc = run_in_session(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--out", str(out), *args),
                          timeout=timeout)
    assert proc.returncode == 0, f"psrv run failed ({proc.returncode}):\n{proc.stdout[-4000:]}"
    return json.loads((out / "summary.json").read_text())


class RecordingNet(ServerTransport):
    """A ServerTransport for a ShardService driven by hand: receives nothing, keeps every reply decoded."""

    address = "fake://shard"

    def __init__(self):
        self.out = []

    def recv(self, timeout):
        return None

    def send(self, peer, frames):
        self.out.append(decode([bytes(memoryview(f)) for f in frames]))

    def close(self):
        pass


def hello_fields(total: int, world_size: int, *, shard: int = 0, num_shards: int = 1, **extra) -> dict:
    """A HELLO's fields for a shard driven by hand: the plan ("p"), its size and the run's shape, and `extra`."""
    return {"plan_hash": "p", "total": total, "num_shards": num_shards, "shard": shard, "world_size": world_size,
            **extra}


def hand_driven(cfg, total: int, hello: dict | None = None, history=None):
    """(ShardService, RecordingNet): shard cfg.shard, of `total` elements, driven by hand, each of cfg's workers
    welcomed (HELLO, with `hello` added to its fields) and rank 0's INIT of zeros taken; their replies are in
    net.out."""
    import torch

    from psrv.protocol import Message, MsgType
    from psrv.server.service import ShardService
    net = RecordingNet()
    svc = ShardService(cfg, net, history=history)
    for w in range(cfg.workers):
        send_to(svc, Message(MsgType.HELLO, worker=w, seq=1, fields=hello_fields(
            total, cfg.workers, shard=cfg.shard, num_shards=cfg.num_shards, **(hello or {}))))
    send_to(svc, Message(MsgType.INIT, worker=0, seq=2, tensor=torch.zeros(svc.state.shard.size)))  # its range's
    return svc, net


def send_to(svc, msg) -> None:
    """`msg` handled by a hand-driven ShardService as if worker msg.worker's connection sent it."""
    from psrv.protocol import encode
    svc.handle(b"peer-%d" % msg.worker, encode(msg))


def each_rank_in_threads(work, ranks: int, *, timeout: float = 60.0) -> None:
    """work(rank) for every rank at once, each in a thread of this process (a worker's loop beside the
    others, as separate processes would run it); AssertionError naming every error a rank raised, or
    TimeoutError if one is still running after `timeout` s."""
    errors = []

    def run(rank: int) -> None:
        try:
            work(rank)
        except BaseException as exc:  # handed to the test
            errors.append((rank, exc))

    threads = [threading.Thread(target=run, args=(r,), name=f"worker-{r}", daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"a worker was still running after {timeout} s")


def in_spawned_process(fn, *args, timeout: float = 120.0):
    """fn(*args) in a fresh Python process (multiprocessing spawn); its return value, or its error.
    `fn` must be importable (a module-level function).

    For in-process torch.distributed (gloo): a gloo thread torn down after destroy_process_group once
    aborted the pytest process itself ("Fatal Python error: Aborted", one test after a gloo run), so
    such runs happen in a pool's child, terminated once it has answered. Not fork: forking a
    process whose torch thread pools are running can hang the child."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pickle.loads(pool.apply_async(_pickled_call, (fn, args)).get(timeout=timeout))


def _pickled_call(fn, args):
    return pickle.dumps(fn(*args))  # plain pickle: tensors copied, no file descriptors shared


def weight_walk(n: int, steps: int, seed: int = 0):
    """n weights that move a little every step, as training moves them: `steps` of them, seeded."""
    import torch  # here: most users of this module start processes and need no torch
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=gen)
    for _ in range(steps):
        w = w - 0.01 * torch.randn(n, generator=gen)
        yield w
