"""Atomic checkpoint files: one dict of plain tensors, numbers and strings per shard, all or nothing.

A file is MAGIC + sha256(payload) + payload, the payload a torch.save of the dict (loaded with
weights_only=True: no pickled code runs). It is written to a temporary file, fsynced and renamed
over the old one, so a crash leaves the old or the new checkpoint, never a torn one; a truncated or
altered file fails the digest and is refused. This module knows files, not servers: a shard hands
it its state_dict() and gets a dict back for its load_state_dict() (psrv/server/service.py).
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from pathlib import Path
from typing import Callable

import torch

from psrv.atomic import replacing

log = logging.getLogger("psrv.checkpoint")
MAGIC = b"PSRVCKPT1\n"
FORMAT = 1  # the payload's layout: bump it when the dict's keys change meaning
PACE_ENV = "PSRV_CHECKPOINT_BYTES_PER_S"  # a cap on the write rate (docs/reliability.md); unset: no cap
BLOCK = 4 << 20  # bytes per write() call: a paced write sleeps between blocks


class CheckpointError(ValueError):
    """A checkpoint (or state dict) that cannot be restored: corrupt, truncated, or another job's."""


def checkpoint_path(directory: str | Path, *, shard: int, num_shards: int) -> Path:
    return Path(directory) / f"shard-{shard}-of-{num_shards}.ckpt"


def write_atomic(path: Path, state: dict, *, bytes_per_s: float = 0.0) -> None:
    """Write `state`, stamped with the format and the time, to `path`: the old file or the new one
    survives a crash, never a torn one. torch.save streams into the file (no second copy of the
    state in memory) through a digest, which then takes its place after MAGIC. `bytes_per_s` > 0
    paces the write to about that rate, so a checkpoint written beside training leaves the disk to
    others (and a test can catch one mid-write)."""
    with replacing(path, "wb", durable=True) as f:
        f.write(MAGIC + bytes(32))  # the digest's place, filled in once the payload is written
        stream = _DigestingWriter(f, bytes_per_s)
        try:
            torch.save({**state, "format": FORMAT, "written": time.time()}, stream)
        except RuntimeError:  # torch's zip writer reports a failed write as a stream position it did not expect
            if stream.error is not None:
                raise stream.error from None  # the real cause (a full disk: ENOSPC), an OSError its callers handle
            raise
        f.seek(len(MAGIC))
        f.write(stream.digest.digest())


class _DigestingWriter:
    """A file to torch.save into: every block goes to `f` and into a sha256, paced to `bytes_per_s`."""

    def __init__(self, f, bytes_per_s: float):
        self.f, self.bytes_per_s = f, bytes_per_s
        self.digest = hashlib.sha256()
        self.error: OSError | None = None  # the first failed write, which torch's writer does not pass on

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        try:
            for start in range(0, len(view), BLOCK):
                block = view[start:start + BLOCK]
                self.digest.update(block)  # hashlib and the write release the GIL for big blocks
                self.f.write(block)
                if self.bytes_per_s > 0:
                    self.f.flush()  # the bytes so far are in the temporary file, where a reader can see them grow
                    time.sleep(len(block) / self.bytes_per_s)
        except OSError as exc:
            self.error = self.error or exc
            raise
        return len(view)

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as exc:
            self.error = self.error or exc
            raise


def pace_from_env() -> float:
    """The write rate cap PSRV_CHECKPOINT_BYTES_PER_S sets (0: none); ValueError naming it if malformed."""
    text = os.environ.get(PACE_ENV, "").strip()
    try:
        rate = float(text) if text else 0.0
    except ValueError:
        rate = -1.0
    if not rate >= 0:
        raise ValueError(f"{PACE_ENV}={text!r}: expected a number of bytes per second >= 0")
    return rate


def read_verified(path: Path) -> dict:
    """The checkpoint's dict; CheckpointError if it is missing, truncated, altered or of another format."""
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
                              f", this psrv reads {FORMAT}: resume with the psrv that wrote it, or start fresh")
    return state


class Checkpointer:
    """One shard's checkpoint file: when it is due (every `every` seconds, if a directory is set),
    writing and reading it, and what the last write held. write() may run on another thread than
    due() and begin() (psrv/server/checkpoints/writer.py writes off the shard's loop)."""

    def __init__(self, directory: str, *, shard: int, num_shards: int, every: float, now: Callable[[], float]):
        self.directory, self.every, self.now = directory, every, now
        self.shard = shard
        self.path = checkpoint_path(directory, shard=shard, num_shards=num_shards) if directory else None
        self.count = 0
        self.version: int | None = None  # the version the last checkpoint holds
        self.seconds: float | None = None  # how long the last successful write took
        self.bytes_per_s = pace_from_env()
        self._last = now()
        self._on_disk = self._last  # when the state the newest checkpoint on disk holds was taken (none: the start)
        # the oldest the newest checkpoint on disk has been, in seconds: a shard dying then would lose that much;
        # --checkpoint-every promises about `every` plus a write, and a writer starved of CPU breaks it
        self.max_age: float | None = None

    def due(self) -> bool:
        return self.path is not None and self.every > 0 and self.now() - self._last >= self.every

    def save(self, state: dict, *, version: int) -> str | None:
        """Write `state` (the shard's, at `version`) now: begin() and write()."""
        self.begin()
        return self.write(state, version=version)

    def begin(self) -> None:
        """A checkpoint starts now: the next is due `every` seconds from here."""
        self._last = self.now()

    def write(self, state: dict, *, version: int) -> str | None:
        """Write `state` (the shard's, at `version`); a failure (disk full...) is logged and answered
        with None, never fatal to the shard's loop."""
        assert self.path is not None, "Checkpointer.write without a directory"
        taken = self._last  # begin()'s: one write at a time, so no other begin() comes before this one lands
        started = time.perf_counter()
        try:
            write_atomic(self.path, state, bytes_per_s=self.bytes_per_s)
        except OSError as exc:
            log.error("shard %d: checkpoint to %s failed: %s", self.shard, self.directory, exc)
            return None
        self.seconds = time.perf_counter() - started
        self.count += 1
        self.version = version
        log.info("shard %d: checkpoint at version %d -> %s (%.3fs)", self.shard, version, self.path, self.seconds)
        self._landed(taken)
        return str(self.path)

    def _landed(self, taken: float) -> None:
        """A checkpoint of the state taken at `taken` is on disk now: until now the one before it was the newest."""
        age = self.now() - self._on_disk
        self.max_age = age if self.max_age is None else max(self.max_age, age)
        if self.every > 0 and age > 2 * self.every:
            log.warning("shard %d: the newest checkpoint on disk was %.1fs old before this one landed "
                        "(--checkpoint-every %gs): the writer is short of CPU or disk; a shard lost then would have "
                        "lost that much", self.shard, age, self.every)
        self._on_disk = taken

    def load(self) -> dict | None:
        """The checkpoint's dict, or None when there is none yet; CheckpointError if it is damaged."""
        assert self.path is not None, "Checkpointer.load without a directory"
        if not self.path.exists():
            log.warning("shard %d: --resume but no checkpoint at %s; starting fresh", self.shard, self.path)
            return None
        return read_verified(self.path)
