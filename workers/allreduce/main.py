"""One rank of an all-reduce baseline as a program (`python -m psrv.workers.allreduce`, started by torchrun or by
`psrv run --mode ddp|fsdp|zero1`): its options, and where its step log writes the record, the progress, the
step beacon and rank 0's params.pt and model.pt."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from psrv.config import ALLREDUCE_MODES, RunConfig
from psrv.config.cli_args import add_config_arguments, config_from_args, given, read_config_file
from psrv.workers.allreduce.loop import BACKENDS, train_allreduce
from psrv.workers.loop import TrainingInterrupted
from psrv.client.steplog import RecordFiles, StepLog


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m psrv.workers.allreduce", description="One rank of an all-reduce baseline "
                                "(--mode ddp, fsdp or zero1; ddp when not given): start it with torchrun (or let "
                                "`psrv run` start it). Example: "
                                "torchrun --nproc-per-node 2 -m psrv.workers.allreduce --steps 100 --out run/worker-{rank}.json")
    p.add_argument("--config", type=Path, metavar="FILE", help="the run's config (a run directory's "
                   "config.json); the options given override it")
    add_config_arguments(p, RunConfig)
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: nccl on cuda, gloo on cpu")
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds (default: %(default)s)")
    p.add_argument("--out", help="write this rank's record (JSON) here; '{rank}' in the path is replaced by "
                   "the rank, else ranks > 0 write NAME-rankR.json beside it")
    p.add_argument("--params-out", type=Path, help="rank 0 saves the final flat parameter vector here")
    p.add_argument("--state-out", type=Path, help="rank 0 saves the final model.state_dict() here (parameters "
                   "and buffers)")
    p.add_argument("--progress-file", help="keep the number of finished steps here ('{rank}' as for --out)")
    p.add_argument("--beacon-file", help="keep this rank's step beacon here ('{rank}' as for --out): its steps "
                   "and the collective it is in, read by psrv run to end a run whose rank hangs "
                   "(--stall-timeout)")
    p.add_argument("--log-level", default="INFO", help="logging level (default: %(default)s)")
    return p


def rank_path(template: str, rank: int) -> Path:
    """--out for this rank: '{rank}' filled in, else NAME-rankR.SUFFIX for ranks > 0."""
    if "{rank}" in template:
        return Path(template.replace("{rank}", str(rank)))
    path = Path(template)
    return path if rank == 0 else path.with_name(f"{path.stem}-rank{rank}{path.suffix}")


def main(argv: list[str] | None = None) -> int:
    from psrv.process import exit_code, interrupt_on_signals
    a = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    interrupt_on_signals()  # a rank is an entry point of its own: SIGTERM takes Ctrl-C's path, rows kept
    logging.basicConfig(level=getattr(logging, str(a.log_level).upper(), logging.INFO),
                        format=f"%(asctime)s ddp-worker {rank} %(levelname)s %(name)s: %(message)s")
    try:
        base = read_config_file(a.config) if a.config else {}
        mode = given(a).get("mode", base.get("mode"))
        if mode is not None and mode not in ALLREDUCE_MODES:
            raise ValueError(f"--mode: a rank runs {', '.join(ALLREDUCE_MODES)}; {mode!r} has servers (psrv run)")
        cfg = config_from_args(RunConfig, a, base=base, extra={} if mode else {"mode": "ddp"})
        first = rank == 0  # rank 0 keeps the weights
        files = RecordFiles(record=rank_path(a.out, rank) if a.out else None,
                            params=a.params_out if first else None, state=a.state_out if first else None,
                            progress=rank_path(a.progress_file, rank) if a.progress_file else None,
                            beacon=rank_path(a.beacon_file, rank) if a.beacon_file else None)
        train_allreduce(cfg, log=StepLog(files), backend=a.backend, timeout=a.timeout)
    except TrainingInterrupted as exc:  # said in one line; its rows are written, not the partial weights
        return exit_code(exc.interrupt)
    except ValueError as exc:
        print(f"psrv.workers.allreduce: error: {exc}", file=sys.stderr)
        return 2
    return 0
