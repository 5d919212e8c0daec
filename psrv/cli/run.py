"""`psrv run`: a whole local cluster on 127.0.0.1 (psrv.experiments.launch), or your own loop with --script."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from psrv.cli.common import base_config, config_arg, dotted, log_level, scheduler_arg, unused_staleness
from psrv.config import RunConfig
from psrv.config.cli_args import add_config_arguments, config_from_args, given


def add(sub) -> None:
    r = sub.add_parser("run", help="run a whole local cluster on 127.0.0.1",
                       description="Start --servers shards and --workers workers on 127.0.0.1, train to the "
                       "end, print a summary and write DIR/summary.json, steps.csv and evals.csv. "
                       "Example: psrv run --mode sync --workers 4 --steps 200. Your own loop instead of a "
                       "job: psrv run --mode sync --workers 2 --script train.py --epochs 3. Each process a SLURM "
                       "job step instead: psrv run --scheduler slurm ...")
    config_arg(r, "run's config")
    add_config_arguments(r, RunConfig)
    log_level(r)
    r.add_argument("--metrics", action="store_true", help="every process serves /metrics; writes DIR/targets.json")
    r.add_argument("--metrics-linger", type=float, default=0.0,
                   help="with --metrics: keep /metrics up this many seconds after the end")
    r.add_argument("--out", type=Path, default=Path("runs/latest"), help="output directory (default: %(default)s)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    scheduler_arg(r)
    r.add_argument("--script", nargs=argparse.REMAINDER, help="FILE.py [ARGS...]: each worker runs your own loop "
                   "on psrv.Worker, python FILE.py ARGS, with RANK, WORLD_SIZE and PSRV_SERVERS set; its record "
                   "(DIR/worker-R.json) feeds steps.csv and summary.json (pass step(loss=..., batch_size=...) to "
                   "log them). Everything after FILE.py is the script's: put psrv's options first. --steps, if "
                   "given, reaches the script as PSRV_STEPS; the job, seed, fault and worker options and "
                   "--mode ddp (torchrun's) are refused")


def command(a: argparse.Namespace) -> int:
    from psrv.experiments.launch import RunFailed, RunInterrupted, run_local
    from psrv.experiments.summary import format_summary
    cfg = config_from_args(RunConfig, a, base=base_config(a))
    unused_staleness(a, cfg.mode)
    script = None
    if a.script is not None:
        from psrv.experiments.script import script_from_args
        script = script_from_args(a.script, cfg, typed=dotted(given(a)))
    from psrv.process import exit_code, interrupt_on_signals, tune_malloc
    tune_malloc()  # this process only launches; the processes it starts tune themselves
    interrupt_on_signals()  # SIGTERM as Ctrl-C: stop the processes in order, keep what ran
    try:
        summary = run_local(cfg, out=a.out, metrics=a.metrics, metrics_linger=a.metrics_linger,
                            progress=not a.no_progress, script=script, scheduler=a.scheduler,
                            say=lambda line: print(line, file=sys.stderr))  # an earlier run's files removed
    except RunFailed as exc:
        print(f"psrv run failed: {exc}", file=sys.stderr)
        return 1
    except RunInterrupted as exc:
        print(f"interrupted: wrote the {exc.summary['steps_done']} steps that ran to {a.out} (incomplete)",
              file=sys.stderr)
        return exit_code(exc.interrupt)
    except KeyboardInterrupt as exc:  # before any process started: nothing to stop or write
        print("psrv run: interrupted before the run started", file=sys.stderr)
        return exit_code(exc)
    print(format_summary(summary))
    print(f"\nwrote {a.out}/summary.json, steps.csv, evals.csv, config.json")
    if cfg.tensorboard:
        from psrv.experiments.tracking import write_run_events
        print(f"wrote TensorBoard events to {write_run_events(cfg, a.out)}")
    return 0
