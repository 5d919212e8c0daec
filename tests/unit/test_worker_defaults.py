"""psrv.Worker's and PSClient's keywords take their defaults from the config tree's sections (WorkerSettings,
Placement), the one source `psrv worker`, `psrv run` and specs use too: they had drifted (PSClient pushed
every small tensor compressed, compress_min_numel 0 against 1024; no warm-up, 0 against 50; sign's l1
scale against auto; shared memory off against auto)."""
from __future__ import annotations

import dataclasses
import inspect

from psrv.config.sections import Placement, WorkerSettings
from psrv.client.psclient import PSClient
from psrv.client.session import Worker
from psrv.client.settings import keyword_default, keyword_names, overlaid

SAME_NAME = ("wire_dtype", "compress", "error_feedback", "compress_min_numel", "momentum_correction",
             "momentum_masking", "compress_warmup", "sign_scale", "push_chunk_mb", "transport", "compress_pull",
             "pull_error_feedback", "pull_resync")


def tree_defaults() -> dict:
    fields = [*dataclasses.fields(WorkerSettings), *dataclasses.fields(Placement)]
    return {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}


def test_psrv_worker_and_psclient_default_to_the_config_trees_values():
    want = tree_defaults()
    for face in (Worker, PSClient):  # the settings keywords' defaults are WorkerSettings' own (psrv/client/settings.py)
        signature = inspect.signature(face.__init__)
        assert {k: keyword_default(signature, k) for k in SAME_NAME} == {k: want[k] for k in SAME_NAME}, face.__name__
        assert keyword_default(signature, "timeout") == want["request_timeout"], face.__name__
    assert overlaid(None, {}, who="PSClient") == WorkerSettings()  # a call that gives none runs on the tree's
    worker = inspect.signature(Worker.__init__)
    assert (keyword_default(worker, "shared_memory"), keyword_default(worker, "bulk"),
            keyword_default(worker, "overlap")) == (want["shared_memory"], want["bulk"], want["overlap"])
    client = inspect.signature(PSClient).parameters  # PSClient takes the planes as flags: 'auto' is on
    assert (client["shared_memory"].default, client["bulk"].default) == (
        want["shared_memory"] == "auto", want["bulk"] == "auto")


class _Keywords(Worker):
    """psrv.Worker's keywords as from_settings passes them, without meeting a shard."""

    def __init__(self, model, servers=None, **keywords):
        self.keywords = {"servers": servers, **keywords}


def test_from_settings_passes_every_worker_setting_by_name():
    from psrv.config import WorkerConfig
    cfg = WorkerConfig(servers=("tcp://127.0.0.1:1",), rank=1, world_size=3, compress="topk:0.1",
                       compress_min_numel=7, compress_warmup=3, request_timeout=4.5, push_chunk_mb=2.0,
                       shared_memory="off", bulk="auto", wire_dtype="float32", compress_pull="sign",
                       pull_error_feedback=False, momentum_masking=True, overlap=False, clip_grad_norm=1.5,
                       error_feedback_decay=0.9)
    got = _Keywords.from_settings(None, cfg, overlap=True).keywords
    assert got == {"servers": ("tcp://127.0.0.1:1",), "rank": 1, "world_size": 3, "transport": "zmq",
                   "timeout": 4.5, "curve_keys": "", "wire_dtype": "float32", "overlap": True,  # the override
                   "clip_grad_norm": 1.5, "local_steps": None, "compress": "topk:0.1", "error_feedback": True,
                   "error_feedback_decay": 0.9,
                   "compress_min_numel": 7, "momentum_correction": True, "momentum_masking": True,
                   "compress_warmup": 3, "sign_scale": "auto", "shared_memory": "off", "bulk": "auto",
                   "push_chunk_mb": 2.0, "compress_pull": "sign", "pull_error_feedback": False, "pull_resync": 100,
                   "fragments": 1, "outer_dtype": "float32", "pull_extrapolate": 0.0, "pull_in_place": False}
    signed = _Keywords.from_settings(None, WorkerConfig(servers=("tcp://127.0.0.1:1",), compress="sign",
                                                        sign_scale="l1", error_feedback=False,
                                                        momentum_correction=False)).keywords
    assert (signed["sign_scale"], signed["error_feedback"], signed["momentum_correction"]) == ("l1", False, False)
    local = _Keywords.from_settings(None, WorkerConfig(servers=("tcp://127.0.0.1:1",), local_steps=4, fragments=2,
                                                       outer_dtype="fp4")).keywords
    assert (local["local_steps"], local["fragments"], local["outer_dtype"]) == (4, 2, "fp4")  # with its inner optimizer


def test_every_worker_setting_reaches_psrv_worker_or_is_the_shipped_loops():
    keywords = set(keyword_names(inspect.signature(Worker.__init__))) | {"request_timeout"}
    loops_own = {"inner_optimizer", "inner_lr"}  # the shipped loop's inner optimizer (workers/local_steps.py)
    assert {f.name for f in dataclasses.fields(WorkerSettings)} - keywords == loops_own
    assert {f.name for f in dataclasses.fields(Placement)} - keywords == {"device"}  # where the model already is
