"""psrv.Worker's and PSClient's keywords take their defaults from the config tree's sections (WorkerSettings,
Placement), the one source `psrv worker`, `psrv run` and specs use too: they had drifted (PSClient pushed
every small tensor compressed, compress_min_numel 0 against 1024; no warm-up, 0 against 50; sign's l1
scale against auto; shared memory off against auto)."""
from __future__ import annotations

import dataclasses
import inspect

from psrv.config.sections import Placement, WorkerSettings
from psrv.worker.client import PSClient
from psrv.worker.session import Worker

SAME_NAME = ("wire_dtype", "compress", "error_feedback", "compress_min_numel", "momentum_correction",
             "momentum_masking", "compress_warmup", "sign_scale", "push_chunk_mb", "transport")


def tree_defaults() -> dict:
    fields = [*dataclasses.fields(WorkerSettings), *dataclasses.fields(Placement)]
    return {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}


def test_psrv_worker_and_psclient_default_to_the_config_trees_values():
    want = tree_defaults()
    for face in (Worker, PSClient):
        got = {k: p.default for k, p in inspect.signature(face).parameters.items()}
        assert {k: got[k] for k in SAME_NAME} == {k: want[k] for k in SAME_NAME}, face.__name__
        assert got["timeout"] == want["request_timeout"], face.__name__
    worker = inspect.signature(Worker).parameters
    assert (worker["shared_memory"].default, worker["bulk"].default, worker["overlap"].default) == (
        want["shared_memory"], want["bulk"], want["overlap"])
    client = inspect.signature(PSClient).parameters  # PSClient takes the planes as flags: 'auto' is on
    assert (client["shared_memory"].default, client["bulk"].default) == (
        want["shared_memory"] == "auto", want["bulk"] == "auto")
