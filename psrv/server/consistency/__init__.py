"""Consistency controllers: pure state machines deciding when pushes apply and pulls are answered."""
from psrv.server.consistency.base import Controller, Decision
from psrv.server.consistency.asynchronous import AsyncController
from psrv.server.consistency.ssp import SSPController
from psrv.server.consistency.sync import SyncController


def make_controller(mode: str, num_workers: int, *, staleness: int = 0, backup_workers: int = 0) -> Controller:
    if mode == "sync":
        return SyncController(num_workers, backup_workers=backup_workers)
    if mode == "async":
        return AsyncController(num_workers)
    if mode == "ssp":
        return SSPController(num_workers, staleness=staleness)
    raise ValueError(f"mode must be one of sync, async, ssp; got {mode!r}")


__all__ = ["AsyncController", "Controller", "Decision", "SSPController", "SyncController", "make_controller"]
