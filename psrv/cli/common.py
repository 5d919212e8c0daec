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
