"""Every psrv Prometheus metric, declared once, handed to servers and workers pre-labelled.

Metrics live in a CollectorRegistry the caller passes in; nothing here touches the global REGISTRY.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from psrv.atomic import write_text

log = logging.getLogger("psrv.metrics")
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)  # unit: shard versions
LR_SCALE_BUCKETS = (1 / 64, 1 / 32, 1 / 16, 1 / 12, 1 / 8, 1 / 6, 1 / 4, 1 / 3, 1 / 2, 1.0)  # 1/staleness
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DROP_REASONS = ("late", "duplicate", "invalid", "partial")  # each emitted by psrv/server/counters.py


class _Spec(NamedTuple):
    kind: type
    name: str
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


_SERVER_LABELS = ("shard", "mode")
_WORKER_LABELS = ("worker", "mode")
_SERVER = {
    "pushes": _Spec(Counter, "psrv_pushes_total",
                    "Pushes received, each once: applied, buffered for the barrier, or dropped as late, "
                    "non-finite (refused or skipped) or given up half-way. Re-sent duplicates are not counted."),
    "pulls": _Spec(Counter, "psrv_pulls_total",
                   "Pulls answered with weights (PULL and the pull half of PUSH_PULL), counted when answered."),
    "updates_applied": _Spec(Counter, "psrv_updates_applied_total",
                             "Optimizer steps applied to the shard."),
    "updates_dropped": _Spec(Counter, "psrv_updates_dropped_total",
                             "Gradients received and never applied, by reason: late (their clock was "
                             "finished without them), duplicate (a re-sent push), invalid (NaN/Inf), partial "
                             "(a chunked push its worker left half-way).",
                             ("reason",)),
    "bytes_received": _Spec(Counter, "psrv_bytes_received_total", "Bytes of every request received."),
    "bytes_sent": _Spec(Counter, "psrv_bytes_sent_total", "Bytes of every reply sent."),
    "push_latency": _Spec(Histogram, "psrv_push_latency_seconds",
                          "Seconds the shard spent handling an accepted push (validate, then apply or buffer).",
                          (), LATENCY_BUCKETS),
    "pull_latency": _Spec(Histogram, "psrv_pull_latency_seconds",
                          "Seconds from a pull's arrival to its answer, the controller's deferral included.",
                          (), LATENCY_BUCKETS),
    "push_staleness": _Spec(Histogram, "psrv_push_staleness",
                            "Per accepted push: the shard's version when it arrived minus the version its "
                            "gradient was computed from.", (), STALENESS_BUCKETS),
    "lr_scale": _Spec(Histogram, "psrv_lr_scale",
                      "Per optimizer step: the factor the update rule scaled the gradient by, i.e. its "
                      "effective lr over --lr (staleness-lr: 1/max(1, staleness); cgad: its sigma(staleness); dn: "
                      "1/N; 1 for plain, dc-asgd, heloco and every sync step).", (), LR_SCALE_BUCKETS),
    "wait_seconds": _Spec(Counter, "psrv_wait_seconds_total",
                          "Seconds answered pulls spent between arrival and answer (held by the BSP "
                          "barrier or the SSP bound), summed."),
    "active_workers": _Spec(Gauge, "psrv_active_workers", "Workers in the shard's active set."),
    "shard_version": _Spec(Gauge, "psrv_shard_version", "The shard's version: optimizer steps applied so far."),
    "worker_clock": _Spec(Gauge, "psrv_worker_clock",
                          "Each active worker's clock as the shard sees it: the steps it has pushed.",
                          ("worker",)),
    "max_clock_gap": _Spec(Gauge, "psrv_max_clock_gap",
                           "Largest clock gap at an answered pull so far: the pulling worker's clock minus "
                           "the slowest active worker's clock (SSP keeps it <= its bound s)."),
}
_WORKER = {
    "steps": _Spec(Counter, "psrv_worker_steps_total", "Training steps completed."),
    "step_seconds": _Spec(Histogram, "psrv_worker_step_seconds", "Wall time of one step.",
                          (), LATENCY_BUCKETS),
    "compute_seconds": _Spec(Counter, "psrv_worker_compute_seconds_total",
                             "Seconds computing steps: batch, forward, backward (and any emulated compute)."),
    "communication_seconds": _Spec(Counter, "psrv_worker_communication_seconds_total",
                                   "Seconds in push/pull minus the time the servers held the pull."),
    "wait_seconds": _Spec(Counter, "psrv_worker_wait_seconds_total",
                          "Seconds the servers held this worker's pulls (BSP barrier or SSP bound)."),
    "samples": _Spec(Counter, "psrv_worker_samples_total", "Training samples processed."),
    "loss": _Spec(Gauge, "psrv_worker_loss", "Training loss of the latest step."),
    "staleness": _Spec(Histogram, "psrv_worker_staleness",
                       "Staleness of this worker's pushes as the servers reported it.",
                       (), STALENESS_BUCKETS),
    "pushes": _Spec(Counter, "psrv_worker_pushes_total",
                    "Pushes sent: one per step, or one per round of inner steps with --local-steps."),
    "pseudo_grad_norm": _Spec(Gauge, "psrv_worker_pseudo_grad_norm",
                              "Norm of the latest pushed pseudo-gradient w_pulled - w_now (--local-steps)."),
    "local_steps": _Spec(Gauge, "psrv_worker_local_steps",
                         "Inner steps of this worker's next round (--local-steps; auto plans them by speed)."),
    "finished": _Spec(Gauge, "psrv_worker_finished",
                      "1 once this worker has done its steps and left the shards, for its last scrapes "
                      "(--metrics-linger); 0 before. A worker whose /metrics went away at 0 died."),
}

METRIC_NAMES = tuple(s.name for s in (*_SERVER.values(), *_WORKER.values()))


def _declare(specs: dict[str, _Spec], registry: CollectorRegistry, base: tuple[str, ...]) -> dict:
    families = {}
    for key, s in specs.items():
        kwargs = {"registry": registry, "labelnames": base + s.labels}
        if s.buckets is not None:
            kwargs["buckets"] = s.buckets
        families[key] = s.kind(s.name, s.doc, **kwargs)
    return families


class ServerMetrics:
    """One shard's metrics; at most one per registry (a registry is one /metrics endpoint)."""

    def __init__(self, registry: CollectorRegistry, *, shard: int, mode: str) -> None:
        f = _declare(_SERVER, registry, _SERVER_LABELS)
        self._labels = {"shard": str(shard), "mode": mode}
        self._dropped = {r: f["updates_dropped"].labels(**self._labels, reason=r)
                         for r in DROP_REASONS}
        self._clock = f["worker_clock"]
        self.pushes = f["pushes"].labels(**self._labels)
        self.pulls = f["pulls"].labels(**self._labels)
        self.updates_applied = f["updates_applied"].labels(**self._labels)
        self.bytes_received = f["bytes_received"].labels(**self._labels)
        self.bytes_sent = f["bytes_sent"].labels(**self._labels)
        self.push_latency = f["push_latency"].labels(**self._labels)
        self.pull_latency = f["pull_latency"].labels(**self._labels)
        self.push_staleness = f["push_staleness"].labels(**self._labels)
        self.wait_seconds = f["wait_seconds"].labels(**self._labels)
        self.lr_scale = f["lr_scale"].labels(**self._labels)
        self.active_workers = f["active_workers"].labels(**self._labels)
        self.shard_version = f["shard_version"].labels(**self._labels)
        self.max_clock_gap = f["max_clock_gap"].labels(**self._labels)

    def dropped(self, reason: str) -> Counter:
        """The psrv_updates_dropped_total child for `reason` (one of DROP_REASONS)."""
        if reason not in self._dropped:
            raise ValueError(f"unknown drop reason {reason!r}; use one of {DROP_REASONS}")
        return self._dropped[reason]

    def worker_clock(self, worker: int) -> Gauge:
        """The psrv_worker_clock child for `worker`."""
        return self._clock.labels(**self._labels, worker=str(worker))

    def forget_worker(self, worker: int) -> None:
        """Drop a departed worker's clock series."""
        try:
            self._clock.remove(self._labels["shard"], self._labels["mode"], str(worker))
        except KeyError:
            pass


class WorkerMetrics:
    """One worker's metrics; declare at most one per registry."""

    def __init__(self, registry: CollectorRegistry, *, worker: int, mode: str) -> None:
        f = _declare(_WORKER, registry, _WORKER_LABELS)
        labels = {"worker": str(worker), "mode": mode}
        self.steps = f["steps"].labels(**labels)
        self.step_seconds = f["step_seconds"].labels(**labels)
        self.compute_seconds = f["compute_seconds"].labels(**labels)
        self.communication_seconds = f["communication_seconds"].labels(**labels)
        self.wait_seconds = f["wait_seconds"].labels(**labels)
        self.samples = f["samples"].labels(**labels)
        self.loss = f["loss"].labels(**labels)
        self.staleness = f["staleness"].labels(**labels)
        self.pushes = f["pushes"].labels(**labels)
        self.pseudo_grad_norm = f["pseudo_grad_norm"].labels(**labels)
        self.local_steps = f["local_steps"].labels(**labels)
        self.finished = f["finished"].labels(**labels)

    def observe_step(self, row: dict) -> None:
        """Record one step from the worker loop's step-log row (see workers/loop.py); a loss or batch
        size the row does not know (None: a user's loop that did not say, psrv/client/steplog.py) is left out."""
        compute, comm, wait = row["compute_seconds"], row["communication_seconds"], row["wait_seconds"]
        self.steps.inc()
        if row["batch_size"] is not None:
            self.samples.inc(row["batch_size"])
        if row["loss"] is not None:
            self.loss.set(row["loss"])
        if row.get("pushed", True):  # a local step (--local-steps) pushed nothing: no staleness
            if row["staleness"] is not None:  # a fragment push's comes with its answer: observe_staleness
                self.staleness.observe(row["staleness"])
            self.pushes.inc()
        self.compute_seconds.inc(compute)
        self.communication_seconds.inc(comm)
        self.wait_seconds.inc(wait)
        self.step_seconds.observe(compute + comm + wait)

    def observe_staleness(self, staleness: int) -> None:
        """A fragment push (streaming DiLoCo) was answered after its step's row: its staleness."""
        self.staleness.observe(staleness)

    def observe_round(self, pseudo_grad_norm: float, next_local_steps: int) -> None:
        """A round of local steps was pushed (--local-steps): its pseudo-gradient's norm, and the
        inner steps planned for the next round."""
        self.pseudo_grad_norm.set(pseudo_grad_norm)
        self.local_steps.set(next_local_steps)


class MetricsEndpoint:
    """`registry` served at http://host:port/metrics from a daemon thread until close().

    port 0 picks a free one (`port` tells which). host "0.0.0.0" exposes it beyond this machine.
    """

    def __init__(self, port: int, registry: CollectorRegistry, *, host: str = "127.0.0.1") -> None:
        started = start_http_server(port, addr=host, registry=registry)
        if started is None:  # prometheus_client < 0.17 returned nothing
            raise RuntimeError("psrv needs prometheus-client>=0.17: upgrade it with pip")
        self._server, self._thread = started
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def open_metrics(kind, port: int, port_file: Path | None = None, *, host: str = "127.0.0.1",
                 **labels) -> tuple[Any, MetricsEndpoint]:
    """`kind`'s metrics (ServerMetrics or WorkerMetrics, given `labels`) in a fresh registry, served on
    `port`; the bound port is written to `port_file`. Returns the metrics and their endpoint."""
    registry = CollectorRegistry()
    metrics = kind(registry, **labels)
    endpoint = MetricsEndpoint(port, registry, host=host)
    log.info("metrics on http://%s:%d/metrics", host, endpoint.port)
    if port_file is not None:
        write_text(port_file, str(endpoint.port))
    return metrics, endpoint


def start_metrics(kind, port: int, port_file: Path | None = None, *, host: str = "127.0.0.1", **labels):
    """open_metrics for the rest of the process (a worker process's metrics): just the metrics."""
    return open_metrics(kind, port, port_file, host=host, **labels)[0]
