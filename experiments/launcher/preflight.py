"""What a run needs that its config cannot say, checked before any of its processes starts: the device
is on this machine and the job's factory imports. A mistake is one ValueError, said once, not a
traceback in some server's or worker's log seconds later.
"""
from __future__ import annotations

from psrv.config import RunConfig
from psrv.device import check_device


def preflight(cfg: RunConfig) -> None:
    """ValueError unless `cfg` can start here. A shipped job needs no check (the config tree knows
    its name), so a cpu run with one imports no torch."""
    check_device(cfg.cluster.device)
    if cfg.job.script:  # a script's run: its file, not the job, is what must be here
        from pathlib import Path
        if not Path(cfg.job.script).is_file():
            raise ValueError(f"job.script: no such file: {cfg.job.script} (a path from the current folder)")
        return
    if ":" in cfg.job.name:
        from psrv.workers.jobs import job_factory
        job_factory(cfg.job.name)
