"""`psrv worker`: one worker training against the servers (the shipped loop, psrv.workers.loop)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from psrv.cli.common import base_config, config_arg, log_level, metrics_args, metrics_file
from psrv.config import WorkerConfig
from psrv.config.address_form import check_shard_addresses, schemes_of
from psrv.config.cli_args import add_config_arguments, config_from_args


def add(sub) -> None:
    w = sub.add_parser("worker", help="run one worker", description="Train one worker against the servers. "
                       "Example: psrv worker --servers tcp://10.0.0.1:5555,tcp://10.0.0.2:5555 --rank 0 "
                       "--world-size 4 --job digits_mlp --steps 300")
    w.add_argument("--servers", help="comma-separated shard addresses (tcp://HOST:PORT), in shard order; @FILE "
                   "waits for FILE (a server's --ready-file) and reads the address from it")
    config_arg(w, "worker's config")
    add_config_arguments(w, WorkerConfig)
    log_level(w)
    w.add_argument("--mode", default="", help="label for this worker's metrics (the servers hold the mode)")
    metrics_args(w)
    w.add_argument("--out", type=Path, help="write this worker's record (JSON) here")
    w.add_argument("--params-out", type=Path, help="save the final flat parameter vector here (torch.save)")
    w.add_argument("--state-out", type=Path, help="save the final model.state_dict() here: parameters and "
                   "this worker's buffers (torch.save)")
    w.add_argument("--progress-file", type=Path, help="keep the number of finished steps in this file")


def command(a: argparse.Namespace) -> int:
    from psrv.process import exit_code, interrupt_on_signals
    interrupt_on_signals()  # SIGTERM takes Ctrl-C's path: train() leaves the shards and keeps its rows
    try:
        return _train_worker(a)
    except KeyboardInterrupt as exc:  # before train() reached the shards: nothing to leave or write
        print(f"psrv worker: interrupted ({str(exc) or 'SIGINT'}) before training began", file=sys.stderr)
        return exit_code(exc)


def _train_worker(a: argparse.Namespace) -> int:
    from psrv.process import exit_code, tune_malloc
    base = base_config(a)
    servers = a.servers if a.servers is not None else ",".join(base.get("servers", []))
    option = "--servers" if a.servers is not None or not a.config else f"--config {a.config}: servers"
    listed = check_shard_addresses(servers.split(","), option=option)  # before torch, or any file's wait
    if not listed:
        raise ValueError("--servers: name at least one shard address (tcp://host:port), or give --config")
    cfg = config_from_args(WorkerConfig, a, base=base, extra={"servers": listed})
    from psrv.device import check_device
    from psrv.workers.jobs import job_factory
    check_device(cfg.device)
    job_factory(cfg.job.name)  # imports a user's job module (from the current folder) before any server is met
    from psrv.transport.addresses import split_addresses
    cfg = cfg.replace(servers=split_addresses(servers, wait=120.0, option=option,  # then wait for @FILE
                                              schemes=schemes_of(cfg.transport)))
    tune_malloc()
    from psrv.process import use_threads
    use_threads(cfg.threads)
    from psrv.client.steplog import RecordFiles, StepLog
    from psrv.workers.loop import TrainingInterrupted, train
    from psrv.process import freeze_imports
    freeze_imports()
    metrics = None
    if a.metrics_port is not None:
        from psrv.metrics import WorkerMetrics, start_metrics
        metrics = start_metrics(WorkerMetrics, a.metrics_port, metrics_file(a), host=a.metrics_host,
                                worker=cfg.rank, mode=a.mode)
    files = RecordFiles(record=a.out, params=a.params_out, state=a.state_out, progress=a.progress_file)
    try:
        train(cfg, log=StepLog(files, metrics=metrics, linger=a.metrics_linger))
    except TrainingInterrupted as exc:  # it said so in one line and left; its rows are written, not its weights
        return exit_code(exc.interrupt)
    return 0
