"""Message types, error codes and the in-memory Message every transport carries."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 2  # 2: a push's `velocity` and the shared-memory plane's new descriptors; docs/protocol.md


class MsgType(enum.IntEnum):
    HELLO = 1        # worker -> shard: plan hash, rank; answered by WELCOME
    WELCOME = 2
    INIT = 3         # rank 0 -> shard: initial weights (tensor frame)
    PUSH = 4         # gradient (tensor frame) for clock c, read at base version bv
    PULL = 5         # weights for clock c; answered by WEIGHTS, possibly deferred
    PUSH_PULL = 6    # PUSH then PULL for clock c+1 in one round trip
    HEARTBEAT = 7
    LEAVE = 8
    STATS = 9        # request/answer: shard statistics in the header
    CHECKPOINT = 10
    SHUTDOWN = 11
    ERROR = 12       # {code, message}
    OK = 13          # plain acknowledgement (PUSH, INIT, HEARTBEAT, LEAVE)
    WEIGHTS = 14     # pull answer: weights as a tensor frame


class ErrorCode(enum.IntEnum):
    MALFORMED = 1          # frames that are not a message
    BAD_VERSION = 2        # protocol version mismatch
    UNKNOWN_TYPE = 3
    BAD_TENSOR = 4         # wrong dtype, length or frame count
    PLAN_MISMATCH = 5      # HELLO with another model's partition plan
    NOT_ALLOWED = 6        # message not valid in this state (e.g. unknown worker)
    TOO_LARGE = 7
    NONFINITE = 8
    INTERNAL = 9
    RANK_IN_USE = 10       # another live process already works as this rank
    NOT_PRIMARY = 11       # a backup or a fenced primary: the shard is served elsewhere (`replicas`: by whom)


class ProtocolError(Exception):
    """A message that cannot be accepted; becomes an ERROR reply, never a crash."""

    def __init__(self, code: ErrorCode, message: str, *, fields: dict[str, Any] | None = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.fields = dict(fields or {})  # more for the ERROR reply (e.g. RANK_IN_USE's worker_timeout)


@dataclass
class Message:
    """One protocol message: header fields plus at most one tensor payload, or named `parts` (a
    compressed push's values, indices, scales: one raw frame each, listed in the header's `p`).

    `tensor` is a 1-D torch tensor when sending; on receive it is a tensor viewing
    the received frame (no copy). `session` is the sending worker process's random id (0: none
    given); it tells two processes claiming the same rank apart.
    """

    type: MsgType
    worker: int = -1
    seq: int = 0
    clock: int = 0
    base_version: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    tensor: Any = None
    session: int = 0
    parts: dict[str, Any] | None = None  # named 1-D tensors, one raw frame each (a compressed push)
