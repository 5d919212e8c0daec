"""`psrv run`: a whole local cluster on 127.0.0.1 (psrv.experiments.launcher.launch), or your own loop with --script."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from psrv.cli.common import (base_config, config_arg, dotted, kubernetes_dry_run, log_level, scheduler_args,
                              unused_staleness)
from psrv.config import RunConfig
from psrv.config.cli_args import add_config_arguments, config_from_args, given
from psrv.config.caveats import quality_caveats


def add(sub) -> None:
    r = sub.add_parser("run", help="run a whole local cluster on 127.0.0.1",
                       description="Start --servers shards and --workers workers on 127.0.0.1, train to the "
                       "end, print a summary and write DIR/summary.json, steps.csv and evals.csv. "
                       "Example: psrv run --mode sync --workers 4 --steps 200. Your own loop instead of a "
                       "job: psrv run --mode sync --workers 2 --script train.py --epochs 3. Each process a SLURM "
                       "job step instead: psrv run --scheduler slurm ...; on Kubernetes, --scheduler kubernetes "
                       "--dry-run prints the run's manifests instead (docs/deploy.md)")
    config_arg(r, "run's config")
    add_config_arguments(r, RunConfig)
    log_level(r)
    r.add_argument("--metrics", action="store_true", help="every process serves /metrics; writes DIR/targets.json")
    r.add_argument("--metrics-linger", type=float, default=0.0,
                   help="with --metrics: keep /metrics up this many seconds after the end")
    r.add_argument("--out", type=Path, default=Path("runs/latest"), help="output directory (default: %(default)s)")
    r.add_argument("--goodput-baseline", type=Path, metavar="DIR", help="a finished fault-free run of the same job "
                   "(its folder): summary.json's `goodput` divides this run's useful samples/s by its, and costs each "
                   "fault in seconds (docs/reliability.md, 'Goodput'). Not part of config.json or its hash")
    r.add_argument("--no-progress", action="store_true", help="no progress: without it, a bar redrawn in place "
                   "on a terminal, and where stderr is a log or a pipe a plain line each tenth of the run (or "
                   "minute) instead of redraws")
    scheduler_args(r)
    r.add_argument("--script", nargs=argparse.REMAINDER, help="FILE.py [ARGS...]: each worker runs your own loop "
                   "on psrv.Worker, python FILE.py ARGS, with RANK, WORLD_SIZE and PSRV_SERVERS set; its record "
                   "(DIR/worker-R.json) feeds steps.csv and summary.json (pass step(loss=..., batch_size=...) to "
                   "log them). Under --mode ddp or zero1 there are no shards: the ranks meet at a torch.distributed "
                   "env:// rendezvous (MASTER_ADDR, MASTER_PORT) and psrv.Worker all-reduces the gradients and "
                   "steps the run's optimizer on every rank. Everything after FILE.py is the script's: put psrv's "
                   "options first. --steps, if given, reaches the script as PSRV_STEPS and --seed as PSRV_SEED; "
                   "its output goes to DIR/worker-R.log. The job, fault, worker and all-reduce options and "
                   "--mode fsdp are refused")
    from psrv.experiments.launcher.torchrun import LAUNCHERS
    r.add_argument("--launcher", choices=LAUNCHERS, default="psrv",
                   help="how --script's workers are started: psrv, one process per rank (the default, each "
                   "writing DIR/worker-R.log), or torchrun, one `torchrun --nproc-per-node WORKERS FILE.py "
                   "ARGS` whose ranks read RANK and WORLD_SIZE from torchrun (their output in DIR/workers.log, "
                   "prefixed [workerR]:). The same run either way: not part of config.json or its hash; "
                   "summary.json's `launcher` says which. torchrun needs --script")


def command(a: argparse.Namespace) -> int:
    from psrv.experiments.launcher.launch import RunFailed, RunInterrupted, run_local
    from psrv.experiments.launcher.summary import format_summary
    cfg = config_from_args(RunConfig, a, base=base_config(a))
    unused_staleness(a, cfg.mode)
    for line in quality_caveats(cfg):  # where a quality grid measured the remedy off its claim: the run goes ahead
        print(f"psrv run: warning: {line}", file=sys.stderr)
    kubernetes = kubernetes_dry_run(a, metrics=a.metrics)
    script = None
    if a.script is not None or cfg.job.script:  # --config FILE of a script's run: that script, hashed as it is now
        from psrv.experiments.launcher.script import script_from_args
        words = a.script if a.script is not None else [cfg.job.script, *cfg.job.script_args]
        here = cfg.replace(cluster=cfg.cluster.replace(device="cpu")) if kubernetes else cfg  # a pod's device is the cluster's
        here, script = script_from_args(words, here, typed=dotted(given(a)))
        cfg = here.replace(cluster=cfg.cluster)
    if kubernetes:
        from psrv.experiments.launcher.kubernetes import run_manifests, run_name, to_yaml
        name = run_name(a.out.name)
        print(to_yaml([(name, run_manifests(cfg, name, a.out.name, kubernetes, script=script))], kubernetes), end="")
        return 0
    from psrv.experiments.launcher.launch import emulated_by
    from psrv.experiments.launcher.torchrun import check_launcher
    check_launcher(a.launcher, script, cfg.mode, hosts=emulated_by(cfg))  # before anything starts
    if cfg.mlflow:
        from psrv.experiments.harness.tracking_mlflow import check_uri
        check_uri(cfg.mlflow)  # an absent client or a URI MLflow refuses, said before anything trains
    from psrv.process import exit_code, interrupt_on_signals, tune_malloc
    tune_malloc()  # this process only launches; the processes it starts tune themselves
    interrupt_on_signals()  # SIGTERM as Ctrl-C: stop the processes in order, keep what ran
    try:
        summary = run_local(cfg, out=a.out, metrics=a.metrics, metrics_linger=a.metrics_linger,
                            progress=not a.no_progress, script=script, launcher=a.launcher, scheduler=a.scheduler,
                            baseline=a.goodput_baseline,
                            say=lambda line: print(line, file=sys.stderr))  # an earlier run's files removed
    except RunFailed as exc:
        print(f"psrv run failed: {exc}", file=sys.stderr)
        if exc.summary is not None:  # what ran until then: experiments/launcher/launch.py
            print(f"wrote the {exc.summary['steps_done']} steps that ran to {a.out} (summary.json marked incomplete, "
                  "steps.csv)", file=sys.stderr)
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
    if script is not None:
        where = "workers.log, rank R's lines [workerR]:" if a.launcher == "torchrun" else "worker-R.log"
        print(f"each rank's own output (its prints, any traceback): {a.out}/{where}")
    if cfg.tensorboard:
        from psrv.experiments.harness.tracking import write_run_events
        print(f"wrote TensorBoard events to {write_run_events(cfg, a.out)}")
    if cfg.mlflow:
        from psrv.experiments.harness.tracking_mlflow import log_run
        print(log_run(cfg, a.out))
    return 0
