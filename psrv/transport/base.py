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
    # the least silence of a replica's stream on this transport that may count its primary gone (a floor under
    # the failure bound's own: psrv/timeouts.py)
    silence_tolerance: float = 0.0

    @abc.abstractmethod
    def recv(self, timeout: float) -> tuple[Hashable, list] | None:
        """Next (peer, frames), or None after `timeout` seconds with nothing."""

    @abc.abstractmethod
    def send(self, peer: Hashable, frames: Sequence[Any]) -> None:
        """Reply to `peer`. Tensor buffers are sent without copying."""

    def wait_sent(self, timeout: float = 30.0) -> bool:
        """Block until every buffer handed to send() may be modified again; False on timeout. The
        service calls it right before it writes such a buffer (the weights), and has written them by
        its next call into this transport."""
        return True

    def share(self, tensor):
        """`tensor`'s values where this transport can send them without a copy (the shard's weights;
        shared memory: psrv/transport/shm.py); by default `tensor` itself."""
        return tensor

    def link(self, address: str) -> "ClientTransport":
        """A line from this shard to another replica of it at `address`, for the replication stream
        (psrv/server/replication/primary.py, follower.py): a client transport whose one peer, shard 0, is that replica,
        answering on its own server transport. A transport that cannot says so."""
        raise NotImplementedError(f"{type(self).__name__} cannot link replicas of a shard")

    @abc.abstractmethod
    def close(self) -> None: ...


class ClientTransport(abc.ABC):
    """A worker's endpoints, one per shard, addressed by shard index."""

    # whether messages sent to one shard reach it in the order sent (zmq: one connection each); where not (torch
    # RPC's calls are served by a pool of threads), a sender that needs the order waits for each answer
    in_order: bool = False

    @abc.abstractmethod
    def send(self, shard: int, frames: Sequence[Any]) -> None: ...

    @abc.abstractmethod
    def recv(self, timeout: float) -> tuple[int, list] | None:
        """Next (shard, frames) from any shard, or None after `timeout` seconds."""

    def share(self, tensor):
        """`tensor`'s values where this transport can send them without a copy; by default `tensor`."""
        return tensor

    def receive_into(self, shard: int, buffer: memoryview | None) -> None:
        """The next tensor payload from `shard` may be written straight into `buffer` (contiguous, the
        payload's size); the frame returned is then `buffer` itself. None withdraws it. A hint: a
        transport may ignore it."""

    def read_in_place(self, shard: int, on: bool) -> None:
        """While on, the weights `shard` names by place in its own memory (shared memory: its weights) come back
        where they lie, read-only, with no copy, and stay held (the shard does not write them) until
        release(shard). A hint: a transport may ignore it, and then copies as before."""

    def held(self, shard: int) -> int | None:
        """The address of the payload held from `shard` (read_in_place), or None."""
        return None

    def release(self, shard: int) -> bool:
        """Done with what is held from `shard`, if anything; False if it changed while held."""
        return True

    def in_place(self, shard: int, tensor) -> bool:
        """Whether `shard` reads a payload of `tensor` where it lies, with no copy on either side (the shared
        gradient over shared memory, psrv/transport/shm.py): such a push gains nothing from going in chunks."""
        return False

    def idle(self) -> None:
        """Every request sent so far is answered: memory held for payloads in flight may go."""

    def down(self, shard: int) -> bool:
        """Whether the connection to `shard` broke and has not come back (its process ended: a kill -9
        closes its sockets at once), where the transport can tell; a recv waiting then returns None at once.
        A hint: False where it cannot tell (a partition, a paused process: the client's probes find those)."""
        return False

    @abc.abstractmethod
    def reconnect(self, shard: int) -> None:
        """Drop the connection to `shard` and its queued messages, and connect afresh."""

    def replicas(self, shard: int) -> list[str]:
        """The addresses of `shard`'s backups this transport knows without asking the shard (a fixed RPC world
        names them); WELCOME tells the others. None by default."""
        return []

    def redirect(self, shard: int, address: str) -> None:
        """Talk to `shard` at `address` from now on (another replica of it: psrv/server/replication/primary.py), on a
        fresh connection. A transport that cannot says so."""
        raise NotImplementedError(f"{type(self).__name__} cannot move a shard to another address")

    @abc.abstractmethod
    def close(self) -> None: ...
