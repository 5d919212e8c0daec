"""`psrv experiment SPEC`: every variant and repeat of a spec, then the report (psrv.experiments.harness.runner)."""
from __future__ import annotations

import argparse
from pathlib import Path

from psrv.cli.common import kubernetes_dry_run, log_level, scheduler_args


def add(sub) -> None:
    e = sub.add_parser("experiment", help="compare modes on one job as a TOML spec says",
                       description="Run every variant and repeat of SPEC, then write summary.csv, plots "
                       "and report.md. A finished run whose stored config is the one SPEC asks for is skipped, "
                       "so an interrupted experiment resumes; one whose config changed is run again (the old "
                       "run kept aside as rep-K.replaced-HASH). "
                       "Example: psrv experiment experiments/specs/modes.toml (writes runs/modes). On a cluster: "
                       "--scheduler kubernetes --dry-run prints every run's manifests instead (docs/deploy.md)")
    e.add_argument("spec", type=Path, help="experiment spec (TOML), e.g. experiments/specs/modes.toml")
    e.add_argument("--out", type=Path, default=None, help="output directory (default: runs/<SPEC file name "
                   "without .toml>; a folder holding another spec file's results is refused unless given here)")
    e.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                   help="also write TensorBoard event files under DIR/<spec name>/<variant>/seed-<seed> (the "
                   "spec's key `tensorboard` says the same; this overrides it); a finished run gets its files "
                   "without being run again")
    e.add_argument("--mlflow", default=None, metavar="URI",
                   help="also log every finished run to the MLflow tracking store at URI, once (a local "
                   "sqlite:///runs/mlflow.db, or a server's http://HOST:5000; needs `pip install psrv[mlflow]`): "
                   "experiment <spec name>, run <variant>/seed-<seed> with its config as params, steps.csv and "
                   "evals.csv as metrics per step, summary.json's numbers; the report and plots as the run "
                   "`report` (the spec's key `mlflow` says the same; this overrides it)")
    e.add_argument("--profile", default=None, metavar="NAME",
                   help="run SPEC as its [profiles.NAME] table says: the same variants on another job (its keys "
                   "laid over the spec's, its own target, `only` some variants); the results go to "
                   "runs/<SPEC name>-NAME by default, e.g. --profile digits_cnn with "
                   "experiments/specs/network.toml")
    scheduler_args(e)
    log_level(e, "WARNING")


def command(a: argparse.Namespace) -> int:
    kubernetes = kubernetes_dry_run(a)
    if kubernetes:  # every variant and repeat as one run's manifests, folders as a local experiment's
        if a.tensorboard is not None:
            raise ValueError("--tensorboard: the event files are written from finished runs here; with "
                             "--scheduler kubernetes gather the runs first (docs/deploy.md)")
        if a.mlflow is not None:
            raise ValueError("--mlflow: the runs are logged from finished runs here; with --scheduler "
                             "kubernetes gather the runs first (docs/deploy.md)")
        from psrv.experiments.launcher.kubernetes import experiment_manifests, to_yaml
        from psrv.experiments.launcher.provenance import default_out
        from psrv.experiments.harness.spec import load_spec
        folder = (a.out or default_out(a.spec, a.profile)).name
        spec = load_spec(a.spec, a.profile)
        print(to_yaml(experiment_manifests(spec, folder, kubernetes), kubernetes), end="")
        return 0
    from psrv.experiments.harness.runner import run_experiment
    from psrv.process import interrupt_on_signals
    interrupt_on_signals()  # SIGTERM as Ctrl-C: the run in progress stops in order and keeps what ran
    return run_experiment(a.spec, out=a.out, tensorboard=a.tensorboard, mlflow=a.mlflow, scheduler=a.scheduler,
                          profile=a.profile)
