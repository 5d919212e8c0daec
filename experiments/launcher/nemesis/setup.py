"""What a run's nemesis needs before any process starts: the checks of where it can run (each refusal one
line), emulated hosts for a partition, and a tmpfs at DIR/checkpoints for disk_full."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import ContextManager

from psrv.config import RunConfig
from psrv.config.nemesis import kinds_of
from psrv.experiments.launcher.kills import CHECKPOINTS
from psrv.experiments.launcher.nemesis.faults import tmpfs
from psrv.experiments.launcher.netns import unavailable


def check_launch(cfg: RunConfig, *, scheduler: str, metrics: bool) -> None:
    """ValueError, in one line, where this run's schedule cannot be done: not under the local launcher, a
    partition without root (emulated hosts) or beside --metrics, disk_full without root."""
    kinds = kinds_of(cfg.nemesis.schedule)
    if not kinds:
        return
    if scheduler != "local":
        raise ValueError(f"--nemesis needs --scheduler local (the launcher signals its own processes); got "
                         f"{scheduler!r}")
    if "partition" in kinds:
        why = unavailable()
        if why:
            raise ValueError(f"--nemesis partition puts each process on an emulated host, and making them {why}; "
                             "kill, pause and late_ack need neither root nor emulated hosts")
        if metrics:
            raise ValueError("--nemesis partition: each process runs on an emulated host of its own, where "
                             "--metrics's ports are out of Prometheus's reach; run without one of them")
    if "disk_full" in kinds and os.geteuid() != 0:
        raise ValueError("--nemesis disk_full: mounting a tmpfs at DIR/checkpoints needs root; kill, pause and "
                         "late_ack do not")


def needs_hosts(cfg: RunConfig) -> bool:
    """Whether the run's processes must run on emulated hosts (a partition cuts the link between two)."""
    return "partition" in kinds_of(cfg.nemesis.schedule)


def checkpoint_disk(cfg: RunConfig, out: Path) -> ContextManager:
    """With disk_full: a tmpfs of nemesis.disk_mb MiB at DIR/checkpoints while the run lasts (its checkpoints
    are moved onto the run folder's disk at the end); otherwise nothing."""
    if "disk_full" not in kinds_of(cfg.nemesis.schedule):
        return contextlib.nullcontext()
    return tmpfs(out / CHECKPOINTS, cfg.nemesis.disk_mb)
