"""A shard service's whole state as one plain dict (what its checkpoint holds), and fresh parts from one.

The dict's keys: the job it belongs to (JOB_KEYS), "plan_hash" and "size" (the partition plan's
hash, this shard's length), then each part's own state_dict: "shard_state" (Shard: parameters,
optimizer state, version, the open clock's sum, the update rule's state: DC-ASGD's pulled weights
per worker and its mean square), "controller" (active set, clocks, sync's open
clock), "dedup" (each worker's last accepted push and its answer), "liveness" (who left, who was lost),
"fragments" (streaming DiLoCo's per-fragment outer optimizers: each one's state, version and so its lr
schedule; psrv/server/fragments.py). A checkpoint written before it held "fragments" loads with none: each
fragment's optimizer then starts afresh at its next push (its state zero, its schedule at update 0), and the
shard says so in one log line.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

from psrv.checkpoint import CheckpointError
from psrv.server.consistency import Controller, controller_for
from psrv.server.dedup import Dedup
from psrv.server.fragments import FragmentShards
from psrv.server.liveness import Liveness
from psrv.server.shard import Shard

if TYPE_CHECKING:
    from psrv.config import ServerConfig

log = logging.getLogger("psrv.server")
JOB_KEYS = ("shard", "num_shards", "workers", "mode", "optimizer")


class Parts(NamedTuple):
    """The service's stateful parts, swapped in together."""

    plan_hash: str
    shard: Shard
    controller: Controller
    dedup: Dedup
    liveness: Liveness
    fragments: FragmentShards


def job(cfg: "ServerConfig") -> dict:
    """What a state must match to be this server's: its shard, the job's size and mode, the optimizer."""
    return {"shard": cfg.shard, "num_shards": cfg.num_shards, "workers": cfg.workers, "mode": cfg.mode,
            "optimizer": cfg.optimizer.name}


def compose(cfg: "ServerConfig", parts: Parts) -> dict:
    return {**job(cfg), "plan_hash": parts.plan_hash, "size": parts.shard.size,
            "shard_state": parts.shard.state_dict(), "controller": parts.controller.state_dict(),
            "dedup": parts.dedup.state_dict(), "liveness": parts.liveness.state_dict(),
            "fragments": parts.fragments.state_dict()}


def build(state: dict, cfg: "ServerConfig", *, liveness: Liveness, source: str) -> Parts:
    """Fresh parts holding `state` (`liveness` is a fresh one to load into). CheckpointError, with
    nothing half-loaded, if `state` is another job's or its parts do not fit together."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{source} is not a state dict but a {type(state).__name__}")
    want = job(cfg)
    got = {k: state.get(k) for k in JOB_KEYS}
    if got != want:
        diff = ", ".join(f"{k} {got[k]!r} (this server: {want[k]!r})" for k in JOB_KEYS if got[k] != want[k])
        raise CheckpointError(f"{source} belongs to another job: {diff}")
    plan_hash, size = state.get("plan_hash"), state.get("size")
    if not isinstance(plan_hash, str) or not isinstance(size, int) or size < 1:
        raise CheckpointError(f"{source} has no partition plan hash or shard size")
    try:
        shard = Shard(size, cfg.optimizer, device=cfg.device)
        shard.load_state_dict(state["shard_state"])
        controller = controller_for(cfg)
        controller.load_state_dict(state["controller"])
        dedup = Dedup()
        dedup.load_state_dict(state["dedup"])
        liveness.load_state_dict(state["liveness"])
        fragments = FragmentShards()
        if "fragments" in state:
            fragments.load_state_dict(state["fragments"], shard)
        else:
            log.info("shard %d: %s holds no per-fragment outer optimizers (written before they were kept): "
                     "under streaming DiLoCo each fragment's optimizer and lr schedule start afresh", cfg.shard, source)
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{source} is incomplete or inconsistent: {type(exc).__name__}: {exc}") from None
    liveness.restart_clocks(controller.active)
    return Parts(plan_hash, shard, controller, dedup, liveness, fragments)
