"""Start a shard in one call, in any thread: transport + service (+ metrics), served until every
worker has left or someone calls stop().

Nothing here changes the host process (no signal handler, no allocator setting): `psrv serve`
wires SIGTERM to `Server.stop` itself, through psrv.process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from psrv.config import ServerConfig
from psrv.device import check_device
from psrv.metrics import ServerMetrics, open_metrics, start_metrics
from psrv.rss import peak_rss_bytes
from psrv.history import History
from psrv.server.faults import InjectedFaults
from psrv.server.service import ShardService
from psrv.transport import create_server
from psrv.transport.addresses import resolve_addresses
from psrv.atomic import write_text

log = logging.getLogger("psrv.server")
BACKUP_WAIT = 120.0  # seconds a backup waits for its primary's ready file (`--backup-of @FILE`)
__all__ = ["Server", "serve", "start_metrics"]  # start_metrics (psrv.metrics) stays importable here for psrv.cli


class Server:
    """One shard, bound when made: `address` is where workers connect (the port resolved for :0).

    `serve()` answers requests in the calling thread until every worker has left or `stop()` is
    called (from any thread, or a signal handler), and returns the shard's summary; `start()` serves
    in a thread of its own and `join()` returns that summary. As a context manager it stops the
    shard, waits for it, and releases its endpoint (also one never served; or call close()). With rpc,
    making the Server waits for the whole RPC world to join.

    With `metrics_port`, /metrics is served (port 0: a free port, written to `metrics_file`) and
    kept up `metrics_linger` seconds after the end so a last scrape sees the final counts. `history`: where
    the shard records its events (docs/history.md); `faults`: a nemesis's injected faults (psrv/server/faults.py).
    """

    def __init__(self, cfg: ServerConfig, *, metrics_port: int | None = None, metrics_file: Path | None = None,
                 metrics_host: str = "127.0.0.1", metrics_linger: float = 0.0, history: History | None = None,
                 faults: InjectedFaults | None = None):
        check_device(cfg.device, option="device")  # a ValueError that says so, not torch's AssertionError
        if "@" in cfg.backup_of:  # a backup started beside its primary waits for its ready file
            cfg = dataclasses.replace(cfg, backup_of=",".join(resolve_addresses(
                cfg.backup_of.split(","), wait=BACKUP_WAIT, option="--backup-of")))
        self.cfg = cfg
        self._linger = metrics_linger if metrics_port is not None else 0.0
        self._thread: threading.Thread | None = None
        self._summary: dict | None = None
        self._error: BaseException | None = None
        self._served = False
        self._metrics_off, self._transport_off = contextlib.ExitStack(), contextlib.ExitStack()
        try:
            metrics = None
            if metrics_port is not None:
                metrics, endpoint = open_metrics(ServerMetrics, metrics_port, metrics_file, host=metrics_host,
                                                 shard=cfg.shard, mode=cfg.mode)
                self._metrics_off.callback(endpoint.close)
            transport = create_server(cfg.transport, cfg.bind, shard=cfg.shard, num_shards=cfg.num_shards,
                                      workers=cfg.workers, max_message_bytes=cfg.max_message_bytes,
                                      shared_memory=cfg.shared_memory == "auto",
                                      bulk=cfg.bulk == "auto" and not cfg.curve_keys,
                                      **({"replicas": cfg.rpc_backups, "backup": bool(cfg.backup_of)}
                                         if cfg.transport == "rpc" else {}),  # its place in the RPC world
                                      **({"curve_keys": cfg.curve_keys} if cfg.curve_keys else {}))
            self._transport_off.callback(transport.close)
            self._service = ShardService(cfg, transport, metrics=metrics, history=history, faults=faults)
        except BaseException:  # a failure half-way releases what was already made
            self.close()
            raise
        self.address: str = transport.address

    @property
    def service(self) -> ShardService:
        """The shard's event loop this Server runs (its state, its replication), for in-process callers."""
        return self._service

    def serve(self) -> dict:
        """Serve in this thread until every worker has left or stop(); the shard's summary."""
        if self._served:
            raise RuntimeError("this Server has already served; make a new one")
        self._served = True
        try:
            summary = self._service.serve()
        except BaseException:
            self.close()
            raise
        self._transport_off.close()
        summary["max_rss_bytes"] = peak_rss_bytes()
        if self._linger > 0:
            time.sleep(self._linger)
        self.close()
        return summary

    def close(self) -> None:
        """Release the endpoint and the metrics server (serve() does it itself when it ends)."""
        self._transport_off.close()
        self._metrics_off.close()

    def stop(self) -> None:
        """End serving soon (within the loop's poll interval), cleanly: the final checkpoint is written."""
        self._service.stop()

    def start(self) -> "Server":
        """Serve from a daemon thread; join() waits for it and returns the summary."""
        if self._thread is not None:
            raise RuntimeError("this Server was already started")
        self._thread = threading.Thread(target=self._serve_in_thread, name=f"psrv-shard-{self.cfg.shard}",
                                        daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> dict:
        """The summary once the started shard ends; TimeoutError if it is still serving after `timeout`,
        and whatever made it fail, re-raised."""
        if self._thread is None:
            raise RuntimeError("join() needs start() first")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"shard {self.cfg.shard} still serving after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._summary

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join()
        self.close()

    def _serve_in_thread(self) -> None:
        try:
            self._summary = self.serve()
        except BaseException as exc:  # handed to join()
            log.exception("shard %d failed", self.cfg.shard)
            self._error = exc


def serve(cfg: ServerConfig, *, metrics_port: int | None = None, metrics_file: Path | None = None,
          metrics_host: str = "127.0.0.1", metrics_linger: float = 0.0, ready_file: Path | None = None,
          on_ready: Callable[[Server], None] | None = None, history: History | None = None,
          faults: InjectedFaults | None = None) -> dict:
    """Bind, announce the address, serve in this thread (any thread); returns the shard's summary once
    every worker has left or the server was stopped.

    Once bound (a backup: once it follows its primary), the address is written to `ready_file` (atomically) and `on_ready(server)` is called
    before serving: it may read `server.address` and keep `server.stop` (psrv serve hands it to
    psrv.process.stop_on_signals). The metrics, history and faults arguments are Server's.
    """
    with Server(cfg, metrics_port=metrics_port, metrics_file=metrics_file, metrics_host=metrics_host,
                metrics_linger=metrics_linger, history=history, faults=faults) as server:
        follower = server.service.replication.follower
        if ready_file is not None and follower is not None:  # a backup is ready once it follows its primary: a
            address = server.address                         # launcher starting workers after it, they hear of it
            follower.on_following = lambda: write_text(ready_file, address)
        elif ready_file is not None:
            write_text(ready_file, server.address)
        if on_ready is not None:
            on_ready(server)
        return server.serve()
