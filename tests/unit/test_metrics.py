"""psrv.metrics: labelled children, names as exported, /metrics over HTTP, no global registry."""
from __future__ import annotations

import re
import urllib.request

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from psrv.metrics import DROP_REASONS, METRIC_NAMES, MetricsEndpoint, ServerMetrics, WorkerMetrics

pytestmark = pytest.mark.timeout(20)


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_are_served_with_their_labels():
    registry = CollectorRegistry()
    server = ServerMetrics(registry, shard=3, mode="ssp")
    worker = WorkerMetrics(registry, worker=1, mode="ssp")
    server.pushes.inc(2)
    server.bytes_received.inc(4096)
    server.push_staleness.observe(3)
    server.dropped("late").inc()
    server.worker_clock(1).set(7)
    server.active_workers.set(2)
    worker.samples.inc(64)
    worker.loss.set(0.25)
    worker.step_seconds.observe(0.01)

    port = MetricsEndpoint(0, registry).port
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    got = _samples(text)

    shard = {("shard", "3"), ("mode", "ssp")}
    assert got[("psrv_pushes_total", frozenset(shard))] == 2
    assert got[("psrv_bytes_received_total", frozenset(shard))] == 4096
    assert got[("psrv_updates_dropped_total", frozenset(shard | {("reason", "late")}))] == 1
    assert got[("psrv_updates_dropped_total", frozenset(shard | {("reason", "duplicate")}))] == 0
    assert got[("psrv_push_staleness_bucket", frozenset(shard | {("le", "4.0")}))] == 1
    assert got[("psrv_push_staleness_bucket", frozenset(shard | {("le", "2.0")}))] == 0
    assert got[("psrv_worker_clock", frozenset(shard | {("worker", "1")}))] == 7
    assert got[("psrv_active_workers", frozenset(shard))] == 2
    me = {("worker", "1"), ("mode", "ssp")}
    assert got[("psrv_worker_samples_total", frozenset(me))] == 64
    assert got[("psrv_worker_loss", frozenset(me))] == 0.25
    assert got[("psrv_worker_step_seconds_count", frozenset(me))] == 1


def test_local_rounds_count_pushes_not_inner_steps():
    registry = CollectorRegistry()
    worker = WorkerMetrics(registry, worker=0, mode="async")
    row = {"compute_seconds": 0.01, "communication_seconds": 0.0, "wait_seconds": 0.0, "batch_size": 8,
           "loss": 1.0, "staleness": 0}
    for step in range(6):  # H = 3: the 3rd and the 6th inner steps push
        worker.observe_step({**row, "pushed": step % 3 == 2})
    worker.observe_round(0.5, 2)
    got = _samples(generate_latest(registry).decode())
    me = frozenset({("worker", "0"), ("mode", "async")})
    assert (got[("psrv_worker_steps_total", me)], got[("psrv_worker_pushes_total", me)]) == (6, 2)
    assert (got[("psrv_worker_pseudo_grad_norm", me)], got[("psrv_worker_local_steps", me)]) == (0.5, 2)
    assert got[("psrv_worker_samples_total", me)] == 48


def test_metric_names_list_exactly_what_is_exported():
    registry = CollectorRegistry()
    ServerMetrics(registry, shard=0, mode="sync").worker_clock(0).set(1)
    WorkerMetrics(registry, worker=0, mode="sync")
    text = generate_latest(registry).decode()
    exported = {re.sub(r"_(bucket|sum|count|created)$", "", s.name)
                for family in text_string_to_metric_families(text) for s in family.samples}
    exported = {n if n in METRIC_NAMES else n + "_total" for n in exported}  # counters' _created
    assert exported == set(METRIC_NAMES)
    assert len(METRIC_NAMES) == len(set(METRIC_NAMES))
    assert all(n.startswith("psrv_") for n in METRIC_NAMES)


def test_nothing_lands_in_the_global_registry():
    ServerMetrics(CollectorRegistry(), shard=0, mode="async")
    WorkerMetrics(CollectorRegistry(), worker=0, mode="async")
    names = generate_latest(prometheus_client.REGISTRY).decode()
    assert "psrv_" not in names


def test_unknown_drop_reason_is_refused():
    server = ServerMetrics(CollectorRegistry(), shard=0, mode="sync")
    for reason in DROP_REASONS:
        server.dropped(reason).inc()
    with pytest.raises(ValueError, match="unknown drop reason"):
        server.dropped("because")


def test_forget_worker_removes_its_clock_series():
    registry = CollectorRegistry()
    server = ServerMetrics(registry, shard=0, mode="ssp")
    server.worker_clock(5).set(3)
    assert 'worker="5"' in generate_latest(registry).decode()
    server.forget_worker(5)
    server.forget_worker(5)  # already gone: no error
    assert 'worker="5"' not in generate_latest(registry).decode()


def test_one_server_metrics_per_registry():
    registry = CollectorRegistry()
    ServerMetrics(registry, shard=0, mode="sync")
    with pytest.raises(ValueError):
        ServerMetrics(registry, shard=1, mode="sync")


def test_observe_step_records_a_worker_loop_row():
    registry = CollectorRegistry()
    worker = WorkerMetrics(registry, worker=2, mode="sync")
    row = {"loss": 1.5, "staleness": 0, "compute_seconds": 0.02, "communication_seconds": 0.01,
           "wait_seconds": 0.03, "batch_size": 32}
    worker.observe_step(row)
    worker.observe_step(row)
    got = _samples(generate_latest(registry).decode())
    me = frozenset({("worker", "2"), ("mode", "sync")})
    assert got[("psrv_worker_steps_total", me)] == 2
    assert got[("psrv_worker_samples_total", me)] == 64
    assert got[("psrv_worker_loss", me)] == 1.5
    assert got[("psrv_worker_wait_seconds_total", me)] == pytest.approx(0.06)
    assert got[("psrv_worker_step_seconds_sum", me)] == pytest.approx(0.12)
    assert got[("psrv_worker_staleness_bucket", me | {("le", "0.0")})] == 2


def test_every_drop_reason_a_shard_counts_is_exported():
    """ShardStats counts drops as late, invalid and partial (a chunked push left half-way, psrv/server/
    chunked.py); each must have its series, or a shard serving /metrics stops at its first such drop."""
    from psrv.server.counters import ShardStats
    metrics = ServerMetrics(CollectorRegistry(), shard=0, mode="async")
    stats = ShardStats(metrics=metrics)
    for reason in ("late", "invalid", "partial"):
        stats.drop(reason)
        assert metrics.dropped(reason)._value.get() == 1, reason


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_worker_says_finished_once_its_whole_record_is_written(tmp_path, interrupted):
    """psrv_worker_finished: 0 while training, 1 once a worker that did its steps has left and written its
    record (what PsrvWorkerDown tells a finished worker by); a worker stopped half-way stays at 0."""
    from psrv.client.steplog import RecordFiles, StepLog
    registry = CollectorRegistry()
    worker = WorkerMetrics(registry, worker=2, mode="sync")
    me = frozenset({("worker", "2"), ("mode", "sync")})
    log = StepLog(RecordFiles(record=tmp_path / "worker-2.json"), metrics=worker)
    log.row(step=0, loss=1.0, compute_seconds=0.01, communication_seconds=0.0, wait_seconds=0.0, batch_size=8,
            staleness=0, pushed=True)
    assert _samples(generate_latest(registry).decode())[("psrv_worker_finished", me)] == 0
    log.save(log.record(interrupted=interrupted))
    assert (tmp_path / "worker-2.json").exists()
    assert _samples(generate_latest(registry).decode())[("psrv_worker_finished", me)] == (0 if interrupted else 1)
