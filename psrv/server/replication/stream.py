"""The replication stream's wire form: what a primary shard and its backups say to each other
(primary.py, follower.py).

A stream message is [MARK, msgpack header, payload frames...]. MARK starts with 0xC1, a byte msgpack never
writes, so it can never be taken for a request (whose first frame is a msgpack header) nor for a payload
plane's marks (psrv/transport/plane.py). The header holds `op` and the sender's `epoch`; the payload is
a forwarded request's own frames (`op` "req"), or a state_dict saved with torch.save ("state").

The ops:
- backup -> primary: "join" {address}: follow me from your state now;
- primary -> backup: "state" {n, replicas} + the state_dict (or no frame: the shard has no state yet),
  "req" {n, peer} + a request's frames, "expire" {n, workers} (workers the primary dropped for silence),
  "ping" (the primary is alive; sent when the stream is idle);
- backup -> primary: "ack" {n} (op n is held), "fenced" {epoch} (a backup that took over refuses an older
  primary's stream), "gap" {n} (an op is missing: send the state again);
- primary -> backup, answering "join": "joined".
"""
from __future__ import annotations

import io
from typing import Any

import msgpack
import torch

MARK = b"\xc1psrv-replica"


def is_stream(frames: list) -> bool:
    """Whether `frames` (a received message, peer identity removed) is a replication message."""
    if not frames:
        return False
    first = memoryview(frames[0])
    return first.nbytes == len(MARK) and bytes(first) == MARK


def frames_of(op: str, epoch: int, payload: list | tuple = (), **fields: Any) -> list:
    """A stream message's frames: the mark, the header, then `payload` (frames sent as they are)."""
    return [MARK, msgpack.packb({"op": op, "epoch": epoch, **fields}), *payload]


def read(frames: list) -> tuple[dict, list]:
    """(header, payload frames) of a stream message; ValueError for one that is not."""
    if not is_stream(frames) or len(frames) < 2:
        raise ValueError("not a replication stream message")
    head = msgpack.unpackb(memoryview(frames[1]), raw=False)
    if not isinstance(head, dict) or not isinstance(head.get("op"), str) or not isinstance(head.get("epoch"), int):
        raise ValueError(f"a replication header without op and epoch: {head!r}")
    return head, list(frames[2:])


def state_bytes(state: dict) -> bytes:
    """A shard's state_dict as one frame (torch.save; a tensor there is written, not shared)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def state_from(frame) -> dict:
    """The state_dict a "state" op carries."""
    return torch.load(io.BytesIO(bytes(memoryview(frame))), map_location="cpu", weights_only=True)
