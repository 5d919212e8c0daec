"""`psrv run`'s cluster as threads of the test process, for tests about what a run computes and counts
(learning, the servers' counts, the staleness bound, the weights against a reference), not about
processes: each process a `psrv run` would start costs a test about 1.8 s of CPU to import torch.

The options are `psrv run`'s own, parsed by psrv's parser into the run's config; every shard is a
psrv.Server served from a thread on 127.0.0.1 and every worker a thread running the shipped loop
(psrv.workers.loop.train), so a run writes what `psrv run --out DIR` writes (config.json, server-i.json,
worker-r.json, params.pt, model.pt, steps.csv, evals.csv, summary.json), built by the same code.
What only processes show (the command line's start-up, signals, crashes, one RPC world per process, the
all-reduce baselines' process groups) stays with `psrv run` (tests/helpers.py psrv_run)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import torch

from psrv.atomic import write_json
from psrv.cli.common import base_config, unused_staleness
from psrv.cli.main import build_parser
from psrv.config import RunConfig
from psrv.config.base import config_hash
from psrv.config.cli_args import config_from_args
from psrv.experiments.launcher.launch import write_config
from psrv.experiments.launcher.summary import build_summary, write_tables
from psrv.server.run import Server
from psrv.client.steplog import RecordFiles, StepLog
from psrv.workers.loop import train


class _Log(StepLog):
    """A worker's step log that says when its job is built: the loop describes the log right after
    load_job and batches_for, and load_job seeds torch's global RNG and then draws the model's initial
    weights from it, so the worker threads build their jobs one at a time, as separate processes would."""

    def __init__(self, files: RecordFiles):
        super().__init__(files)
        self.built = threading.Event()

    def describe(self, **fields) -> None:
        super().describe(**fields)
        self.built.set()


def run_in_threads(cfg: RunConfig, out: Path | None = None, *, timeout: float = 180.0) -> tuple[list[dict], list[dict]]:
    """The run `cfg` in threads: (each worker's record as the shipped loop returns it, rank order; each
    shard's summary, shard order). With `out`, the files `psrv run` writes there (records, params.pt,
    model.pt, server-i.json). A worker's error is raised here, and so is a run past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one each, as the launcher's OMP_NUM_THREADS gives each process on 2 cores
    servers = [Server(cfg.server_config(i, bind="tcp://127.0.0.1:0")).start() for i in range(cfg.cluster.servers)]
    addresses = tuple(s.address for s in servers)
    records: dict[int, dict] = {}
    failures: list[BaseException] = []
    threads = []
    try:
        for rank in range(cfg.cluster.workers):
            first = rank == 0
            files = RecordFiles() if out is None else RecordFiles(
                record=out / f"worker-{rank}.json", params=out / "params.pt" if first else None,
                state=out / "model.pt" if first else None, progress=out / f"worker-{rank}.progress")
            log = _Log(files)

            def work(rank=rank, log=log) -> None:
                try:
                    records[rank] = train(cfg.worker_config(rank, servers=addresses), log=log)
                except BaseException as exc:  # handed to the test
                    failures.append(exc)

            thread = threading.Thread(target=work, name=f"worker-{rank}", daemon=True)
            thread.start()
            threads.append(thread)
            while not log.built.wait(0.01) and thread.is_alive():  # its job built: the next one may build its own
                if time.monotonic() > deadline:
                    raise AssertionError(f"worker {rank} did not build its job in {timeout}s")
        running = threads
        while running and not failures and time.monotonic() < deadline:  # a worker's failure ends the run
            running[0].join(0.05)
            running = [t for t in running if t.is_alive()]
        if failures:
            raise failures[0]
        if any(t.is_alive() for t in threads):
            raise AssertionError(f"workers still running after {timeout}s")
        shards = [server.join(max(1.0, deadline - time.monotonic())) for server in servers]
        if out is not None:
            for i, shard in enumerate(shards):
                write_json(out / f"server-{i}.json", shard)
    finally:
        for server in servers:
            server.stop()
        torch.set_num_threads(torch_threads)
    return [records[r] for r in range(cfg.cluster.workers)], shards


def threaded_run(out: Path, *args: str, timeout: float = 180.0) -> dict:
    """`psrv run ... --out out` with its shards and workers in threads of this process; its summary.json."""
    a = build_parser().parse_args(["run", "--no-progress", "--log-level", "WARNING", "--out", str(out), *args])
    cfg = config_from_args(RunConfig, a, base=base_config(a))
    unused_staleness(a, cfg.mode)
    if cfg.is_allreduce or cfg.cluster.transport != "zmq" or a.script or a.metrics or cfg.network.bandwidth:
        raise ValueError("threaded_run: a parameter-server run over zmq without --script, --metrics or a "
                         "bandwidth cap; run the others with psrv_run")
    out.mkdir(parents=True, exist_ok=True)
    write_config(out / "config.json", cfg)
    run_in_threads(cfg, out, timeout=timeout)
    summary = {**build_summary(cfg, out), "config_hash": config_hash(cfg)}
    write_tables(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
