"""A run as `psrv run` makes it, in this process: every shard a psrv.Server served from a thread on
127.0.0.1, every worker a thread running the shipped worker loop (workers/loop.py `train`) on the
worker config `psrv run` would write. For tests of what a run computes, not of its processes: each
process started costs its import of torch (about 1.5 s of CPU), a thread nothing.

Jobs are made one at a time: load_job seeds torch's global generator and then draws the model's
initial weights from it, and in one process two workers making theirs at once would interleave draws."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from psrv.config import RunConfig
from psrv.server.run import Server
from psrv.workers import loop

TIMEOUT = 120.0
_making = threading.Lock()


@contextlib.contextmanager
def _jobs_one_at_a_time() -> Iterator[None]:
    made = loop.load_job

    def load_job(name: str, *, seed: int):
        with _making:
            return made(name, seed=seed)
    loop.load_job = load_job
    try:
        yield
    finally:
        loop.load_job = made


def run_in_threads(cfg: RunConfig, *, timeout: float = TIMEOUT) -> tuple[list[dict], list[dict]]:
    """(each worker's record from `train`, rank order; each shard's summary, shard order). A worker's
    error is raised here; so is a shard still serving `timeout` seconds after its workers ended."""
    servers = [Server(cfg.server_config(s, bind="tcp://127.0.0.1:0")).start() for s in range(cfg.cluster.servers)]
    addresses = tuple(s.address for s in servers)
    records: dict[int, dict] = {}
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            records[rank] = loop.train(cfg.worker_config(rank, servers=addresses))
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    try:
        with _jobs_one_at_a_time():
            threads = [threading.Thread(target=work, args=(r,), name=f"worker-{r}", daemon=True)
                       for r in range(cfg.cluster.workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout)
        if errors:
            raise errors[0]
        if any(t.is_alive() for t in threads):
            raise TimeoutError(f"a worker was still running after {timeout}s")
        shards = [s.join(timeout) for s in servers]
    finally:
        for s in servers:
            s.stop()
    return [records[r] for r in range(cfg.cluster.workers)], shards
