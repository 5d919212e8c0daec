"""Consistency controllers: pure state machines deciding when pushes apply and pulls are answered."""
from psrv.server.consistency.base import Controller, Decision
from psrv.server.consistency.asynchronous import AsyncController
from psrv.server.consistency.quorum import QuorumController
from psrv.server.consistency.ssp import SSPController
from psrv.server.consistency.sync import SyncController


def make_controller(mode: str, num_workers: int, *, staleness: int = 0, backup_workers: int = 0, quorum: int = 0,
                    quorum_max_age: int = 0, quorum_grace: bool = False, quorum_wait: bool = False) -> Controller:
    if mode == "sync" and quorum:
        return QuorumController(num_workers, quorum=quorum, max_age=quorum_max_age, grace=quorum_grace,
                                wait=quorum_wait)
    if mode == "sync":
        return SyncController(num_workers, backup_workers=backup_workers)
    if mode == "async":
        return AsyncController(num_workers)
    if mode == "ssp":
        return SSPController(num_workers, staleness=staleness)
    raise ValueError(f"mode must be one of sync, async, ssp; got {mode!r}")


def controller_for(cfg) -> Controller:
    """A shard's controller, from its config (a ServerConfig: mode and its settings)."""
    return make_controller(cfg.mode, cfg.workers, staleness=cfg.staleness, backup_workers=cfg.backup_workers,
                           quorum=cfg.quorum, quorum_max_age=cfg.quorum_max_age, quorum_grace=cfg.quorum_grace > 0, quorum_wait=cfg.quorum_wait)


__all__ = ["AsyncController", "Controller", "Decision", "QuorumController", "SSPController", "SyncController",
           "controller_for", "make_controller"]
