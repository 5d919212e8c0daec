"""psrv: a parameter server for sync, async and SSP data-parallel training experiments.

The public face: `PSClient` (push/pull/push_pull), `serve` (start a shard in one call) and
`train` (a worker loop in one call), with their configs. Names are imported on first use, so
that `import psrv.config` (the launcher, `psrv --help`) does not pay for importing torch.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"
_WHERE = {"PSClient": "psrv.client", "PSError": "psrv.client", "FaultConfig": "psrv.config",
          "OptimConfig": "psrv.config", "ServerConfig": "psrv.config", "WorkerConfig": "psrv.config",
          "PartitionPlan": "psrv.partition", "serve": "psrv.server.run"}
__all__ = sorted(_WHERE) + ["__version__"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'psrv' has no attribute {name!r}")
