"""psrv: a parameter server for sync, async and SSP data-parallel training experiments.

The public face: `PSClient` (push/pull/push_pull), `serve` (start a shard in one call) and
`train` (a worker loop in one call), with their configs.
"""
from psrv.client import PSClient, PSError
from psrv.config import FaultConfig, OptimConfig, ServerConfig, WorkerConfig
from psrv.server.partition import PartitionPlan
from psrv.server.run import serve

__version__ = "0.1.0"
__all__ = ["FaultConfig", "OptimConfig", "PSClient", "PSError", "PartitionPlan", "ServerConfig",
           "WorkerConfig", "serve", "__version__"]
