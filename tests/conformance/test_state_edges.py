"""What no failure case can show about psrv.Worker.load_state_dict (psrv/client/compression_state.py), found by
`make mutants`: the restart case (test_failures.py) loads a state that fits; a state that does not (a codec's
residuals, momentum correction's velocity or onebit_adam's momentum on one side only) is refused in one line
that says which, and nothing of the worker's state changes. Real shards served from threads on 127.0.0.1."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from psrv.config import from_dict
from psrv.config.optimizer import OptimConfig
from psrv.server.run import Server
from psrv.client import Worker
from tests.conformance import job as tiny
from tests.conformance.failures import config


@pytest.fixture
def shards():
    started: list[Server] = []

    def start(optimizer: str = "sgd") -> list[str]:
        cfg = config("async")
        if optimizer == "onebit_adam":  # sync only
            onebit = from_dict(OptimConfig, {"name": "onebit_adam", "lr": 0.003, "freeze_step": 2})
            sync = config("sync")  # one worker: a sync shard's final pull waits for every worker's leave
            cfg = dataclasses.replace(sync, optimizer=onebit, cluster=dataclasses.replace(sync.cluster, workers=1))
        server = Server(cfg.server_config(0, bind="tcp://127.0.0.1:0")).start()
        started.append(server)
        return [server.address]
    yield start
    for server in started:
        server.stop()


def _worker(addresses: list[str], rank: int, world_size: int = 2, **options) -> Worker:
    return Worker(tiny.model(0), addresses, rank=rank, world_size=world_size, timeout=30.0, **options)


def _same(a: dict, b: dict) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def _refused(worker: Worker, state: dict, says: str) -> None:
    """`state` refused with the line `says`, the worker's own state as it was."""
    before = worker.state_dict()
    with pytest.raises(ValueError) as refused:
        worker.load_state_dict(state)
    assert str(refused.value) == says
    assert _same(worker.state_dict(), before), "a refused state changed the worker"


def test_a_state_that_does_not_fit_is_refused_and_changes_nothing(shards):
    addresses = shards()
    coded = _worker(addresses, 0, compress="topk:0.1")  # residuals and (SGD momentum 0.9) momentum correction
    plain = _worker(addresses, 1, compress_pull="int8")  # a pull codec keeps no state here: its residuals are the shard's
    state, bare = coded.state_dict(), plain.state_dict()
    assert state["compress"] is not None and state["velocity"] is not None and state["onebit"] is None
    assert bare == {"steps": 0, "compress": None, "onebit": None, "velocity": None}
    assert coded.compression() == {"compress": "topk:0.1", "error_feedback": True, "compress_pull": "",
                                   "momentum_correction": True}
    assert plain.compression() == {"compress": "", "error_feedback": False, "compress_pull": "int8",
                                   "momentum_correction": False}
    with torch.no_grad():  # a state unlike the worker's own, so that a load that took part of it would show
        state = {**state, "steps": 5, "compress": {k: v + 1 if isinstance(v, torch.Tensor) else v
                                                   for k, v in state["compress"].items()}}
    _refused(coded, {**state, "compress": None},
             "the state was saved without a push codec, and this worker runs with one")
    _refused(plain, {**bare, "compress": state["compress"]},
             "the state was saved with a push codec, and this worker runs without one")
    _refused(coded, {**state, "velocity": None},
             "the state was saved without momentum correction's velocity, and this worker runs with it")
    _refused(plain, {**bare, "velocity": state["velocity"]},
             "the state was saved with momentum correction's velocity, and this worker runs without it")
    _refused(coded, {**state, "onebit": {"momentum": torch.zeros(1), "freeze_step": 2}},
             "the state was saved with onebit_adam's local momentum, and the shards run another optimizer")
    coded.load_state_dict(state)  # and one that fits is taken whole
    assert _same(coded.state_dict(), state)
    coded.load_state_dict({k: v for k, v in state.items() if k != "steps"})  # no count in it: the worker keeps its own
    assert coded.steps == 5
    for worker in (plain, coded):  # rank 0 last: its close waits for the others to leave
        worker.close()


def test_a_state_without_onebit_adams_momentum_is_refused_where_the_shards_run_it(shards):
    addresses = shards("onebit_adam")
    worker = _worker(addresses, 0, world_size=1)
    state = worker.state_dict()
    assert state["onebit"] is not None and state["compress"] is not None  # the momentum and its sign's residuals
    _refused(worker, {**state, "onebit": None},
             "the state was saved without onebit_adam's local momentum, and the shards run it")
    moved = {**state, "onebit": {**state["onebit"], "momentum": state["onebit"]["momentum"] + 1}}
    worker.load_state_dict(moved)  # one that fits is taken whole, the momentum too
    assert _same(worker.state_dict(), moved)
    worker.close()
