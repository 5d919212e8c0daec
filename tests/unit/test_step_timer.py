"""The one definition of a step's seconds (psrv/client/step_timer.py) that psrv.Worker, the all-reduce worker and
both shipped loops write into their step rows: compute from the previous step's end to the gradient being ready,
less evaluations; the wait for others as measured; communication the rest. Times are given, not slept, except in
the last test, where psrv.Worker (a real shard served from a thread on 127.0.0.1) counts a slow evaluation off."""
from __future__ import annotations

import dataclasses
import time

import pytest

from psrv.server.run import Server
from psrv.client import Worker
from psrv.client.step_timer import StepTimer
from psrv.client.steplog import StepLog
from tests.conformance import job as tiny
from tests.conformance.failures import config


def test_a_step_is_compute_to_its_gradient_then_the_wait_and_communication_to_its_end():
    timer = StepTimer(began=10.0)
    timer.computed(at=13.0)
    timer.computed(at=14.0)  # a second mark in one step (each gradient collective's hook): the first counts
    timer.off_clock(1.0)  # an evaluation before the step
    assert timer.row(waited=0.5, end=15.0) == {"compute_seconds": 2.0, "communication_seconds": 1.5,
                                               "wait_seconds": 0.5}
    timer.computed(at=16.0)  # the next step begins where the last ended, its off-clock time gone
    assert timer.row(end=16.25) == {"compute_seconds": 1.0, "communication_seconds": 0.25, "wait_seconds": 0.0}


def test_a_wait_longer_than_the_step_after_its_compute_is_cut_to_it_and_a_step_never_computed_is_all_compute():
    timer = StepTimer(began=0.0)
    timer.computed(at=1.0)
    assert timer.row(waited=5.0, end=2.0) == {"compute_seconds": 1.0, "communication_seconds": 0.0,
                                              "wait_seconds": 1.0}
    assert timer.row(end=3.5) == {"compute_seconds": 1.5, "communication_seconds": 0.0, "wait_seconds": 0.0}
    timer.restart(at=4.0)  # the caller did more after the row (psrv.Worker's evaluations): the step begins later
    timer.computed(at=4.5)
    assert timer.row(end=5.0)["compute_seconds"] == 0.5


@pytest.mark.timeout(60)
def test_psrv_worker_counts_the_time_between_its_steps_as_compute_and_an_evaluation_as_none():
    cfg = config("async")
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, workers=1))
    server = Server(cfg.server_config(0, bind="tcp://127.0.0.1:0")).start()
    evaluations = []

    def evaluate() -> dict:  # one second each: a step whose compute held one would show it
        evaluations.append(time.perf_counter())
        time.sleep(1.0)
        return {"loss": 1.0}

    try:
        log, model = StepLog(), tiny.model(0)
        ps = Worker(model, [server.address], rank=0, world_size=1, timeout=30.0, step_log=log, evaluate=evaluate,
                    eval_every=1)
        batch = next(tiny.batches(rank=0, world_size=1, batch_size=8, seed=0))
        for _ in range(3):
            time.sleep(0.05)  # the loop's own compute, beside backward
            tiny.loss(model, batch).backward()
            ps.step()
        ps.close()
    finally:
        server.stop()
    assert len(evaluations) == 5  # step 0, after each of the 3 steps, and at close
    assert [r["step"] for r in log.rows] == [0, 1, 2]
    for row in log.rows:
        assert 0.05 <= row["compute_seconds"] < 1.0, row  # the sleep and backward, not the evaluation before it
        assert row["communication_seconds"] > 0 and row["wait_seconds"] >= 0
