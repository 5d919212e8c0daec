"""What the commands share: the options several of them take, a config file as the base of the tree, and
the checks and files they have in common."""
from __future__ import annotations

import argparse
from pathlib import Path

from psrv.config.cli_args import given, read_config_file


def config_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--config", type=Path, metavar="FILE", help=f"start from this {what} (JSON, as a run "
                   "directory's config.json holds it); the options given on the command line override it")


def log_level(p: argparse.ArgumentParser, default: str = "INFO") -> None:
    p.add_argument("--log-level", default=default, help="logging level (default: %(default)s)")


def metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port "
                   "(0: a free port, written beside --out as .metrics)")
    p.add_argument("--metrics-linger", type=float, default=0.0,
                   help="keep /metrics up this many seconds after the end, for a last scrape")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics listens on; 0.0.0.0 lets other hosts scrape (default: %(default)s)")


def base_config(a: argparse.Namespace) -> dict:
    return read_config_file(a.config) if a.config else {}


def unused_staleness(a: argparse.Namespace, mode: str) -> None:
    """--staleness typed with a mode that has no bound: a mistake (a config file's default one is not)."""
    if "staleness" in given(a) and mode != "ssp":
        raise ValueError(f"--staleness: only used with --mode ssp (mode is {mode!r}); remove it")


def dotted(tree: dict, prefix: str = "") -> set[str]:
    """The dotted keys of a nested dict (the options given, as `given` nests them)."""
    return {k for key, v in tree.items()
            for k in (dotted(v, f"{prefix}{key}.") if isinstance(v, dict) else {f"{prefix}{key}"})}


def metrics_file(a: argparse.Namespace) -> Path | None:
    """Where a process announces its bound /metrics port: beside its --out file."""
    return a.out.with_suffix(".metrics") if a.out else None


def scheduler_args(p: argparse.ArgumentParser) -> None:
    """--scheduler (psrv.experiments.launcher.schedulers lists the choices) and the options of kubernetes' dry run
    (experiments/launcher/kubernetes.py)."""
    from psrv.experiments.launcher.schedulers import SCHEDULERS, scheduler_help
    p.add_argument("--scheduler", choices=tuple(SCHEDULERS), default="local", help=scheduler_help())
    p.add_argument("--dry-run", action="store_true", help="with --scheduler kubernetes: print the manifests "
                   "(multi-document YAML) and start nothing")
    p.add_argument("--image", default=None, help="with --scheduler kubernetes: the container image, psrv installed "
                   "and `python` on its PATH (default: psrv:latest; docs/deploy.md builds it)")
    p.add_argument("--namespace", default=None, help="with --scheduler kubernetes: the namespace (default: default)")
    p.add_argument("--pvc", default=None, metavar="CLAIM", help="with --scheduler kubernetes: the "
                   "PersistentVolumeClaim (ReadWriteMany) holding the run folders at /runs (default: an emptyDir "
                   "per pod, lost with it)")


def kubernetes_dry_run(a: argparse.Namespace, *, metrics: bool = False):
    """The KubernetesOptions of `--scheduler kubernetes --dry-run`; None for --scheduler local. ValueError,
    in one line, for a scheduler option without its scheduler, or kubernetes without --dry-run."""
    given_options = [f"--{k}" for k in ("image", "namespace", "pvc") if getattr(a, k) is not None]
    if a.scheduler != "kubernetes":
        if a.dry_run or given_options:
            raise ValueError(f"{'--dry-run' if a.dry_run else given_options[0]}: only with --scheduler kubernetes")
        return None
    if not a.dry_run:
        raise ValueError("--scheduler kubernetes: psrv does not reach a cluster itself; add --dry-run to print the "
                         "manifests, then apply them with kubectl apply -f - (docs/deploy.md)")
    from psrv.experiments.launcher.kubernetes import KubernetesOptions
    defaults = KubernetesOptions()
    return KubernetesOptions(image=a.image or defaults.image, namespace=a.namespace or defaults.namespace,
                             pvc=a.pvc or "", metrics=metrics)
