"""What the commands share: the options several of them take, a config file as the base of the tree, and
the checks and files they have in common."""
from __future__ import annotations

import argparse
import time
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


def scheduler_arg(p: argparse.ArgumentParser) -> None:
    """--scheduler: where the run's processes start (psrv.experiments.schedulers lists the choices)."""
    from psrv.experiments.schedulers import SCHEDULERS, scheduler_help
    p.add_argument("--scheduler", choices=tuple(SCHEDULERS), default="local", help=scheduler_help())


def base_config(a: argparse.Namespace) -> dict:
    return read_config_file(a.config) if a.config else {}


def unused_staleness(a: argparse.Namespace, mode: str) -> None:
    """--staleness typed with a mode that has no bound: a mistake (a config file's default one is not)."""
    if "staleness" in given(a) and mode != "ssp":
        raise ValueError(f"--staleness: only used with --mode ssp (mode is {mode!r}); remove it")


def server_addresses(text: str, *, wait: float) -> tuple[str, ...]:
    """Shard addresses from --servers. An entry @FILE is read from FILE, a server's --ready-file, once
    it exists: a worker can start (and import torch) while its servers are still starting."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        if item.startswith("@"):
            path, deadline = Path(item[1:]), time.monotonic() + wait
            while not (path.exists() and path.read_text().strip()):
                if time.monotonic() > deadline:
                    raise ValueError(f"server address file {path} did not appear within {wait:.0f}s")
                time.sleep(0.02)
            item = path.read_text().strip()
        out.append(item)
    return tuple(out)


def dotted(tree: dict, prefix: str = "") -> set[str]:
    """The dotted keys of a nested dict (the options given, as `given` nests them)."""
    return {k for key, v in tree.items()
            for k in (dotted(v, f"{prefix}{key}.") if isinstance(v, dict) else {f"{prefix}{key}"})}


def metrics_file(a: argparse.Namespace) -> Path | None:
    """Where a process announces its bound /metrics port: beside its --out file."""
    return a.out.with_suffix(".metrics") if a.out else None
