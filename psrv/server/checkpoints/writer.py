"""A shard's checkpoints written off its event loop, so pushes are answered while one is written.

On the loop, a checkpoint costs one copy of the state (tensors cloned: parameters, optimizer state,
the update rule's; the exactly-once table, clocks and membership copied as plain data). A writer
thread then serialises, checksums, writes and fsyncs that copy (psrv/checkpoint.py write_atomic:
temporary file, fsync, rename), while the loop goes on stepping the shard's own tensors.

The copy's tensors are kept for the next checkpoint's copy (so a shard holds its state twice once
it has checkpointed), which then costs a memcpy without page faults. At most one write is in flight. A periodic checkpoint that falls due while one is writing is not
queued: it starts from the state of that moment once the write in flight is done (so writes slower
than --checkpoint-every run back to back, never piled up). save_now() (a CHECKPOINT request, the
final checkpoint at exit or SIGTERM) waits for the write in flight, then writes and waits for its own.
A CHECKPOINT request is answered off the loop too (psrv/server/checkpoints/handler.py AdminCheckpoints).
A crash mid-write leaves the previous checkpoint whole: only the temporary file is torn.
The writer thread runs at a lower CPU priority (nice +WRITER_NICE, Linux), so on a busy host the
serialising and hashing take the cores the shard's loop leaves idle.
"""
from __future__ import annotations

import logging
import os
import threading

import torch

from psrv.checkpoint import Checkpointer

log = logging.getLogger("psrv.server")
WRITER_NICE = 10


def detached(obj, reuse=None):
    """A copy of `obj` (dicts, lists, tuples, tensors, plain values) that shares no tensor or container
    with it: what a state_dict, whose tensors are the shard's own, must become before a thread writes it.
    Tensors are copied into `reuse`'s (an earlier copy no longer read) where they match in place, shape,
    dtype and device: an allocation of a big shard's size costs its page faults on the loop each time."""
    if torch.is_tensor(obj):
        if (torch.is_tensor(reuse) and reuse.shape == obj.shape and reuse.dtype == obj.dtype
                and reuse.device == obj.device):
            return reuse.copy_(obj.detach())
        return obj.detach().clone()
    if isinstance(obj, dict):
        earlier = reuse if isinstance(reuse, dict) else {}
        return {key: detached(value, earlier.get(key)) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        earlier = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(obj) else [None] * len(obj)
        return type(obj)(detached(value, e) for value, e in zip(obj, earlier))
    return obj


class BackgroundCheckpoints:
    """`files`' checkpoints, each copied on the caller's thread and written from a writer thread."""

    def __init__(self, files: Checkpointer):
        self.files = files
        self._writer: threading.Thread | None = None
        self._copy: dict | None = None  # the last copy written: the next copy's tensors go into its
        self.result: str | None = None  # the last write's path, None if it failed (read once it is done)

    @property
    def writing(self) -> bool:
        """A write is in flight."""
        return self._writer is not None and self._writer.is_alive()

    def start(self, state: dict, *, version: int) -> bool:
        """Copy `state` (the shard's, at `version`) now and write the copy from a thread; False, with
        nothing started, while another write is in flight."""
        if self.writing:
            return False
        self._copy = detached(state, self._copy)  # the last write is done: its copy is free to reuse
        self.files.begin()
        self._writer = threading.Thread(target=self._write, args=(self._copy, version), daemon=True,
                                        name=f"psrv-checkpoint-{self.files.shard}")
        self._writer.start()
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Until the write in flight (if any) is done: on disk, fsync'd and renamed, or failed and logged."""
        if self._writer is not None:
            self._writer.join(timeout)

    def save_now(self, state: dict, *, version: int) -> str | None:
        """Write `state` and return once it is on disk: its path, or None if the write failed."""
        self.wait()
        return self.files.save(state, version=version)

    def _write(self, copy: dict, version: int) -> None:
        try:  # Linux nices a thread by its id; elsewhere the writer keeps the loop's priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        except (AttributeError, OSError):
            pass
        self.result = None
        try:
            self.result = self.files.write(copy, version=version)  # an OSError is logged there, and is None
        except Exception:  # anything else (a state torch cannot save) must not pass silently either
            log.exception("shard %d: checkpoint at version %d failed", self.files.shard, version)
