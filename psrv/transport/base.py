"""The Transport interface (ps-lite's Van): bind/connect, send frames, receive frames.

A frame list is what psrv.protocol.codec makes: a header and at most one raw buffer. This module
imports no implementation; psrv.transport.create_server/create_client pick one by name.
"""
from __future__ import annotations

import abc
from typing import Any, Hashable, Sequence

class ServerTransport(abc.ABC):
    """One shard's endpoint: receives requests from any worker and replies to a peer."""

    address: str  # the address workers connect to (port resolved)

    @abc.abstractmethod
    def recv(self, timeout: float) -> tuple[Hashable, list] | None:
        """Next (peer, frames), or None after `timeout` seconds with nothing."""

    @abc.abstractmethod
    def send(self, peer: Hashable, frames: Sequence[Any]) -> None:
        """Reply to `peer`. Tensor buffers are sent without copying."""

    def wait_sent(self, timeout: float = 30.0) -> bool:
        """Block until every buffer handed to send() may be modified again; False on timeout."""
        return True

    @abc.abstractmethod
    def close(self) -> None: ...


class ClientTransport(abc.ABC):
    """A worker's endpoints, one per shard, addressed by shard index."""

    @abc.abstractmethod
    def send(self, shard: int, frames: Sequence[Any]) -> None: ...

    @abc.abstractmethod
    def recv(self, timeout: float) -> tuple[int, list] | None:
        """Next (shard, frames) from any shard, or None after `timeout` seconds."""

    @abc.abstractmethod
    def reconnect(self, shard: int) -> None:
        """Drop the connection to `shard` and its queued messages, and connect afresh."""

    @abc.abstractmethod
    def close(self) -> None: ...
