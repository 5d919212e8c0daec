"""Where a run's processes start: `--scheduler` of `psrv run` and `psrv experiment`.

The scheduler is how a run's processes are started, never what they compute: it is not in the config
tree, so a run's config hash (and an experiment's reuse of finished runs) does not depend on it;
summary.json's `scheduler` says where the run ran.

A scheduler is a name in SCHEDULERS and, unless it is "local", a context manager `hosts(processes, out=,
timeout=)` yielding what experiments/launcher/cluster.Cluster takes as `hosts`: `wrap(host, argv, name=)` (argv run
on host `host`), `address(host)` (the IP a process there binds and is reached at), optionally
`signal(names, signum)` (where a signal to the started process would not reach the task) and
`gloo_interface`. Adding one is an entry here and such a class.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

SCHEDULERS = {
    "local": "every process on this machine, on 127.0.0.1 (or on emulated hosts with --bandwidth)",
    "slurm": "every process one SLURM job step (srun) of one allocation per run; the run folder must be on a "
             "filesystem every node shares (docs/deploy.md)",
    "kubernetes": "with --dry-run, print each run's manifests (a ConfigMap, a headless Service and Indexed Jobs of "
                  "servers and workers) for kubectl apply -f -; psrv reaches no cluster itself (docs/deploy.md)",
}


def scheduler_help() -> str:
    """The --scheduler option's help: each choice and what it does."""
    return "where the processes start: " + "; ".join(f"{k}: {v}" for k, v in SCHEDULERS.items()) + \
        " (default: local). Not part of the config hash: a finished run is reused whichever ran it"


def check_scheduler(name: str, *, metrics: bool = False, bandwidth: str = "") -> None:
    """ValueError, in one line naming the option, for a scheduler this run cannot use, or one whose commands
    are not here: said before any process starts (and before an experiment's first run)."""
    if name not in SCHEDULERS:
        raise ValueError(f"--scheduler {name!r}: choose one of {', '.join(SCHEDULERS)}")
    if name == "local":
        return
    if name == "kubernetes":  # the command line prints the manifests and starts nothing (psrv/cli/common.py)
        raise ValueError("--scheduler kubernetes: psrv does not reach a cluster itself; add --dry-run to print the "
                         "manifests, then apply them with kubectl apply -f - (docs/deploy.md)")
    if bandwidth:
        raise ValueError(f"--scheduler {name}: network.bandwidth {bandwidth} emulates hosts on this machine; "
                         "run it with --scheduler local")
    if metrics:
        raise ValueError(f"--scheduler {name}: --metrics writes targets.json for 127.0.0.1; scrape the nodes "
                         "yourself, or run it with --scheduler local")
    if name == "slurm":
        from psrv.experiments.launcher.slurm import unavailable
        why = unavailable()
        if why:
            raise ValueError(f"--scheduler slurm: {why}")


def scheduler_hosts(name: str, processes: int, *, out: Path, timeout: float):
    """The hosts a Cluster starts its `processes` on under scheduler `name`, as a context manager (None for
    local: the Cluster starts them itself)."""
    check_scheduler(name)
    if name == "slurm":
        from psrv.experiments.launcher.slurm import SlurmAllocation, job_name
        return SlurmAllocation(processes, name=job_name(out), timeout=timeout)
    return contextlib.nullcontext(None)
