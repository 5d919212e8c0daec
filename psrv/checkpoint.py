"""Atomic sharded checkpoints: each shard writes its own file, restores all of it or nothing.

A file is MAGIC + sha256(payload) + payload, the payload a torch.save of plain tensors,
numbers and strings (loaded with weights_only=True: no pickled code runs). It is written to
a temporary file, fsynced and renamed over the old one, so a crash leaves the old or the new
checkpoint, never a torn one; a truncated or altered file fails the digest and is refused.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from psrv.server.consistency import make_controller
from psrv.server.dedup import Dedup
from psrv.server.liveness import Liveness
from psrv.server.shard import Shard

if TYPE_CHECKING:
    from psrv.server.service import ShardService

log = logging.getLogger("psrv.checkpoint")
MAGIC = b"PSRVCKPT1\n"
FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored (corrupt, truncated, or another job's)."""


def checkpoint_path(directory: str | Path, *, shard: int, num_shards: int) -> Path:
    return Path(directory) / f"shard-{shard}-of-{num_shards}.ckpt"


def write_atomic(path: Path, state: dict) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a crash
    finally:
        os.close(fd)


def read_verified(path: Path) -> dict:
    """The checkpoint's state; CheckpointError if it is missing, truncated or altered."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror}") from None
    head = len(MAGIC) + 32
    if len(data) < head or not data.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a psrv checkpoint (or is truncated); delete it or drop --resume")
    if hashlib.sha256(data[head:]).digest() != data[len(MAGIC):head]:
        raise CheckpointError(f"{path} is corrupt or truncated (checksum mismatch); refusing to resume from it")
    try:
        state = torch.load(io.BytesIO(data[head:]), map_location="cpu", weights_only=True)
    except Exception as exc:  # the digest matched, so this is another writer's format
        raise CheckpointError(f"{path} cannot be loaded: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {state.get('format') if isinstance(state, dict) else '?'}"
                              f", this psrv reads {FORMAT}")
    return state


def capture(service: "ShardService") -> dict:
    """Everything a shard needs to carry on: parameters, optimizer, version, clocks, dedup table."""
    cfg = service.cfg
    return {"format": FORMAT, "shard": cfg.shard, "num_shards": cfg.num_shards, "workers": cfg.workers,
            "mode": cfg.mode, "optimizer": cfg.optim.name, "plan_hash": service.plan_hash,
            "size": service.shard.size, "shard_state": service.shard.state_dict(),
            "controller": service.controller.state_dict(), "dedup": service.dedup.state_dict(),
            "liveness": service.liveness.state_dict(), "written": time.time()}


def save(service: "ShardService", directory: str | Path) -> Path | None:
    """Write the shard's checkpoint; None when there is nothing to keep yet (no weights: no INIT)."""
    if service.shard is None or not service.shard.initialised:
        return None
    path = checkpoint_path(directory, shard=service.cfg.shard, num_shards=service.cfg.num_shards)
    started = time.perf_counter()
    write_atomic(path, capture(service))
    log.info("shard %d: checkpoint at version %d -> %s (%.3fs)", service.cfg.shard, service.shard.version,
             path, time.perf_counter() - started)
    return path


class Checkpointer:
    """When a shard checkpoints (every `every` seconds, if a directory is set) and what it wrote."""

    def __init__(self, directory: str, *, every: float, now: Callable[[], float]):
        self.directory, self.every, self.now = directory, every, now
        self.count = 0
        self.version: int | None = None  # the version the last checkpoint holds
        self._last = now()

    def due(self) -> bool:
        return bool(self.directory) and self.every > 0 and self.now() - self._last >= self.every

    def save(self, service: "ShardService") -> str | None:
        """Write now; a failure (disk full...) is logged, never fatal to the shard's loop."""
        self._last = self.now()
        try:
            path = save(service, self.directory)
        except OSError as exc:
            log.error("shard %d: checkpoint to %s failed: %s", service.cfg.shard, self.directory, exc)
            return None
        if path is not None:
            self.count += 1
            self.version = service.shard.version
        return str(path) if path else None


def restore(service: "ShardService", state: dict, *, source: str = "checkpoint") -> None:
    """Load `state` into `service`: everything is built and checked first, then swapped in at once."""
    cfg = service.cfg
    want = {"shard": cfg.shard, "num_shards": cfg.num_shards, "workers": cfg.workers, "mode": cfg.mode,
            "optimizer": cfg.optim.name}
    got = {k: state.get(k) for k in want}
    if got != want:
        diff = ", ".join(f"{k} {got[k]!r} (this server: {want[k]!r})" for k in want if got[k] != want[k])
        raise CheckpointError(f"{source} belongs to another job: {diff}")
    plan_hash, size = state.get("plan_hash"), state.get("size")
    if not isinstance(plan_hash, str) or not isinstance(size, int) or size < 1:
        raise CheckpointError(f"{source} has no partition plan hash or shard size")
    try:
        shard = Shard(size, cfg.optim, device=cfg.device)
        shard.load_state_dict(state["shard_state"])
        for slot in shard.optimizer.state_dict()["state"].values():  # momentum, Adam moments: one per element
            for name, value in slot.items():
                if torch.is_tensor(value) and value.dim() > 0 and tuple(value.shape) != (size,):
                    raise ValueError(f"optimizer state {name} has shape {tuple(value.shape)}, the shard {size}")
        controller = make_controller(cfg.mode, cfg.workers, staleness=cfg.staleness,
                                     backup_workers=cfg.backup_workers)
        controller.load_state_dict(state["controller"])
        dedup = Dedup()
        dedup.load_state_dict(state["dedup"])
        old = service.liveness
        liveness = Liveness(timeout=old.timeout, join_timeout=old.join_timeout, now=old.now)
        liveness.load_state_dict(state["liveness"])
    except CheckpointError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{source} is incomplete or inconsistent: {type(exc).__name__}: {exc}") from None
    liveness.restart_clocks(controller.active)
    service.shard, service.plan_hash, service.controller = shard, plan_hash, controller
    service.dedup, service.liveness, service.resumed_from = dedup, liveness, shard.version
    log.info("shard %d: resumed from %s at version %d (active workers %s)", cfg.shard, source,
             shard.version, sorted(controller.active))


def resume(service: "ShardService", directory: str | Path) -> bool:
    """Restore the shard's checkpoint from `directory` if there is one; False when there is none."""
    path = checkpoint_path(directory, shard=service.cfg.shard, num_shards=service.cfg.num_shards)
    if not path.exists():
        log.warning("shard %d: --resume but no checkpoint at %s; starting fresh", service.cfg.shard, path)
        return False
    restore(service, read_verified(path), source=str(path))
    return True
