"""Start a shard in one call: transport + service (+ metrics), serve until every worker left."""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from psrv.config import ServerConfig
from psrv.server.service import ShardService
from psrv.transport import create_server

log = logging.getLogger("psrv.server")


def serve(cfg: ServerConfig, *, metrics_port: int | None = None, ready_file: Path | None = None) -> dict:
    """Bind, announce the address, serve; returns the shard's summary once all workers have left."""
    metrics = None
    if metrics_port is not None:
        from psrv.metrics import ServiceMetrics
        metrics = ServiceMetrics.serve(cfg, port=metrics_port)
    transport = create_server(cfg.transport, cfg.bind, max_message_bytes=cfg.max_message_bytes)
    service = ShardService(cfg, transport, metrics=metrics)
    signal.signal(signal.SIGTERM, lambda *_: setattr(service, "stopped", True))
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(transport.address)
        os.replace(tmp, ready_file)
    try:
        return service.serve()
    finally:
        transport.close()
