"""A script's held-out metrics: psrv.Worker.log_eval(metrics) and evaluate=/eval_every, against a real shard
(psrv.Server in a thread on 127.0.0.1): the evaluations land in the worker record at the steps done, the
last one gives final_loss, eval_metrics and eval_accuracy, evaluate= runs on rank 0 only and off the clock,
and a mistake is one ValueError."""
from __future__ import annotations

import json
import time

import pytest
import torch

import psrv
from psrv.config import RunConfig, from_dict
from psrv.server.run import Server
from psrv.client.steplog import RecordFiles, StepLog
from tests.helpers import each_rank_in_threads


def _serve(workers: int):
    cfg = from_dict(RunConfig, {"mode": "sync", "cluster": {"servers": 1, "workers": workers}})
    server = Server(cfg.server_config(0, bind="tcp://127.0.0.1:0")).start()
    yield server.address
    server.stop()


@pytest.fixture
def shard():
    yield from _serve(2)


@pytest.fixture
def lone_shard():
    yield from _serve(1)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def _train(model, ps, steps: int) -> None:
    g = torch.Generator().manual_seed(ps.rank)
    for _ in range(steps):
        x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        ps.step(loss=loss, batch_size=8)


def _two_workers(address, tmp_path, make) -> list[dict]:
    """Ranks 0 and 1 in threads, each `make(rank, model, log)` -> (Worker, steps); their records."""
    def work(rank):
        model = _model()
        log = StepLog(RecordFiles(record=tmp_path / f"worker-{rank}.json"))
        ps, steps = make(rank, model, log)
        _train(model, ps, steps)
        ps.close()
        if rank == 0 and getattr(ps, "after", None):
            ps.log_eval(ps.after(model))
    each_rank_in_threads(work, 2)
    return [json.loads((tmp_path / f"worker-{r}.json").read_text()) for r in range(2)]


def _metrics(model) -> dict:
    with torch.no_grad():
        out = model(torch.ones(5, 4))
    return {"loss": torch.nn.functional.cross_entropy(out, torch.zeros(5, dtype=torch.long)),  # a tensor is taken
            "accuracy": float((out.argmax(1) == 0).float().mean())}


def test_evaluate_runs_on_rank_0_at_0_every_k_steps_and_at_close_off_the_clock(shard, tmp_path):
    calls = {0: [], 1: []}

    def make(rank, model, log):
        def evaluate():
            calls[rank].append(time.perf_counter())
            time.sleep(0.05)
            return _metrics(model)
        return psrv.Worker(model, [shard], rank=rank, world_size=2, step_log=log, evaluate=evaluate,
                           eval_every=3), 7
    zero, one = _two_workers(shard, tmp_path, make)
    assert [e["step"] for e in zero["evals"]] == [0, 3, 6, 7] and len(calls[0]) == 4 and calls[1] == []
    assert one["evals"] == [] and "eval_metrics" not in one
    last = zero["evals"][-1]
    assert zero["eval_metrics"] == {"loss": last["eval_loss"], "accuracy": last["eval_accuracy"]}
    assert (zero["final_loss"], zero["eval_accuracy"]) == (last["eval_loss"], last["eval_accuracy"])
    assert zero["initial_loss"] == zero["evals"][0]["eval_loss"] != last["eval_loss"]  # the weights moved
    assert (zero["metric"], zero["lower_is_better"]) == ("accuracy", False)
    assert 0.15 <= zero["eval_seconds"] < 0.5   # the three between steps (and the first): off the clock
    assert zero["steps"] == 7 and len(zero["step_log"]) == 7


def test_log_eval_after_close_is_the_final_weights_and_rewrites_the_record(shard, tmp_path):
    def make(rank, model, log):
        ps = psrv.Worker(model, [shard], rank=rank, world_size=2, step_log=log)
        if rank == 0:
            ps.log_eval({"loss": 2.5, "top5": 0.5})
            ps.after = _metrics
        return ps, 4
    zero, _ = _two_workers(shard, tmp_path, make)
    first, final = zero["evals"]
    assert (first["step"], first["eval_loss"], first["eval_top5"]) == (0, 2.5, 0.5) and zero["initial_loss"] == 2.5
    assert final["step"] == 4 and zero["final_loss"] == final["eval_loss"]
    assert zero["eval_metrics"] == {"loss": final["eval_loss"], "accuracy": final["eval_accuracy"]}


@pytest.mark.parametrize("keywords, says", [
    ({"eval_every": 5}, "eval_every needs evaluate="),
    ({"evaluate": lambda: {}, "eval_every": -1}, "eval_every must be an int >= 0"),
    ({"evaluate": "loss"}, "evaluate= takes a function"),
])
def test_evaluation_keywords_are_checked_before_any_shard_is_met(keywords, says):
    with pytest.raises(ValueError, match=says):
        psrv.Worker(_model(), ["tcp://127.0.0.1:9"], rank=0, world_size=1, timeout=0.5, **keywords)


@pytest.mark.parametrize("metrics, says", [
    ({}, "non-empty dict"), ([("loss", 1.0)], "non-empty dict"), ({"loss": "low"}, "must be a number"),
    ({"top-1": 0.5}, "an identifier"), ({"loss": torch.ones(2)}, "must be a number"),
])
def test_log_eval_takes_a_dict_of_numbers(lone_shard, metrics, says):
    with psrv.Worker(_model(), [lone_shard], rank=0, world_size=1) as ps:
        with pytest.raises(ValueError, match=says):
            ps.log_eval(metrics)
