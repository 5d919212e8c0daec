"""Start a shard in one call: transport + service (+ metrics), serve until every worker left."""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from psrv.config import ServerConfig
from psrv.rss import peak_rss_bytes
from psrv.server.service import ShardService
from psrv.transport import create_server

log = logging.getLogger("psrv.server")


def serve(cfg: ServerConfig, *, metrics_port: int | None = None, metrics_file: Path | None = None,
          metrics_host: str = "127.0.0.1", metrics_linger: float = 0.0, ready_file: Path | None = None) -> dict:
    """Bind, announce the address, serve; returns the shard's summary once all workers have left.

    With `metrics_port`, /metrics is served (port 0: a free port, written to `metrics_file`) and
    kept up `metrics_linger` seconds after the end so a last scrape sees the final counts.
    """
    metrics = None
    if metrics_port is not None:
        from psrv.metrics import ServerMetrics
        metrics = start_metrics(ServerMetrics, metrics_port, metrics_file, host=metrics_host,
                                shard=cfg.shard, mode=cfg.mode)
    transport = create_server(cfg.transport, cfg.bind, shard=cfg.shard, num_shards=cfg.num_shards,
                              workers=cfg.workers, max_message_bytes=cfg.max_message_bytes,
                              **({"curve_keys": cfg.curve_keys} if cfg.curve_keys else {}))
    service = ShardService(cfg, transport, metrics=metrics)
    signal.signal(signal.SIGTERM, lambda *_: setattr(service, "stopped", True))
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(transport.address)
        os.replace(tmp, ready_file)
    try:
        summary = service.serve()
    finally:
        transport.close()
    summary["max_rss_bytes"] = peak_rss_bytes()
    if metrics is not None and metrics_linger > 0:
        time.sleep(metrics_linger)
    return summary


def start_metrics(kind, port: int, port_file: Path | None, *, host: str = "127.0.0.1", **labels):
    """A fresh registry with `kind`'s metrics, served on `port`; the bound port goes to `port_file`."""
    from prometheus_client import CollectorRegistry

    from psrv.metrics import serve_metrics
    registry = CollectorRegistry()
    metrics = kind(registry, **labels)
    bound = serve_metrics(port, registry, host=host)
    log.info("metrics on http://%s:%d/metrics", host, bound)
    if port_file is not None:
        port_file.parent.mkdir(parents=True, exist_ok=True)
        port_file.write_text(str(bound))
    return metrics
