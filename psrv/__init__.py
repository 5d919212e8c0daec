"""psrv: a parameter server for sync, async and SSP data-parallel training experiments.

Its public names, each imported on first use (so `import psrv` alone does not import torch):

    Worker          a worker in your own loop: Worker(model), then backward() and step(); close()
    make_worker     the run's worker: a Worker, or an AllReduceWorker under --mode ddp or zero1 (one script, every mode)
    AllReduceWorker the same loop all-reducing its gradients among the ranks (DDP's math; ZeRO-1's)
    StepInfo        what Worker.step() returns: step, clock, version, staleness, waited, seconds
    PSClient        a worker's link to every shard: hello, init, push, pull, push_pull
    PSError         what PSClient raises when a shard answers ERROR
    PartitionPlan   a model's parameters as one flat vector, cut into byte-balanced shards
    Server          one shard bound to its address: serve() here, or start() a thread; stop(), join()
    serve           bind a shard and serve it in this thread until every worker has left
    ServerConfig    a shard's settings
    WorkerConfig    a worker's settings
    OptimConfig     the server-side optimizer's settings
    FaultConfig     emulated stragglers and network delays
    __version__     this package's version

The library never changes its host process; psrv's own entry points set the process-wide things
(allocator, SIGTERM) through psrv.process.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"
_WHERE = {"Worker": "psrv.client.session", "make_worker": "psrv.client.make",
          "AllReduceWorker": "psrv.client.allreduce", "StepInfo": "psrv.client.step_info",
          "PSClient": "psrv.client.psclient", "PSError": "psrv.client.psclient", "PartitionPlan": "psrv.partition",
          "Server": "psrv.server.run", "serve": "psrv.server.run", "ServerConfig": "psrv.config",
          "WorkerConfig": "psrv.config", "OptimConfig": "psrv.config", "FaultConfig": "psrv.config"}
__all__ = [*_WHERE, "__version__"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'psrv' has no attribute {name!r}")
