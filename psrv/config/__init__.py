"""The one config tree: every setting of psrv, declared once (psrv/config/sections.py; the optimizer's in
psrv/config/optimizer.py, the worker's in psrv/config/worker_settings.py), composed into what each
process is given (psrv/config/processes.py). The command line, spec keys and launched processes' JSON
are derived from it; docs/architecture.md draws the tree."""
from psrv.config.base import ConfigError, Section, from_dict, merge, to_dict
from psrv.config.optimizer import OPTIMIZERS, OptimConfig
from psrv.config.processes import RunConfig, ServerConfig, WorkerConfig
from psrv.config.sections import (ALLREDUCE_MODES, MODES, RUN_MODES, TRANSPORTS, WIRE_DTYPES, ClusterConfig,
                                  FaultConfig, JobConfig, ServerSettings, ServeSettings, WorkerSettings)

__all__ = ["ALLREDUCE_MODES", "MODES", "OPTIMIZERS", "RUN_MODES", "TRANSPORTS", "WIRE_DTYPES", "ClusterConfig",
           "ConfigError", "FaultConfig", "JobConfig", "OptimConfig", "RunConfig", "Section", "ServerConfig",
           "ServerSettings", "ServeSettings", "WorkerConfig", "WorkerSettings", "from_dict", "merge", "to_dict"]
