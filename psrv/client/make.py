"""psrv.make_worker: one script, every mode. The run's worker for a model, chosen by the run's mode in sight
of the caller: psrv.Worker (psrv/client/session.py) in a parameter-server mode, psrv.AllReduceWorker
(psrv/client/allreduce.py) where PSRV_MODE is ddp or zero1, as `psrv run --mode ddp --script train.py` and a
spec's all-reduce arm set it.

    ps = psrv.make_worker(model)     # sync, async, ssp: a psrv.Worker; ddp, zero1: an AllReduceWorker
"""
from __future__ import annotations

import inspect

from psrv.client.allreduce import AllReduceWorker
from psrv.client.keywords import allreduce_mode
from psrv.client.session import Worker


def make_worker(*args, **keywords) -> Worker | AllReduceWorker:
    """psrv.Worker(*args, **keywords) in a parameter-server mode; under an all-reduce run, the all-reduce
    worker with the run's config (PSRV_CONFIG) and the keywords that apply there (rank, world_size, timeout,
    clip_grad_norm, step_log, evaluate, eval_every). A parameter-server option given a value of its own
    (servers, local_steps, compress, ...) is refused there in one line, naming it."""
    if allreduce_mode() is None:
        return Worker(*args, **keywords)
    return AllReduceWorker.from_worker_call(inspect.signature(Worker.__init__), *args, **keywords)


make_worker.__signature__ = inspect.signature(Worker)  # psrv.Worker's keywords, for help() and editors
