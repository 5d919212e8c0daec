"""Payload planes: another path for a message's big tensor frame, beside the zmq connection.

A psrv message is [msgpack header, tensor frame]. Where a plane is set up between a worker and a shard,
a tensor frame of at least MIN_BYTES leaves the zmq message, which then carries a small descriptor
instead: [PAYLOAD, header, descriptor]. The plane moves the bytes by its own path (shared memory for
co-located processes, psrv/transport/shm.py; a plain TCP connection read with recv_into,
psrv/transport/bulk.py) and the receiving transport hands the service or the client the same
[header, tensor frame] it would have had: nothing above psrv/transport/ knows planes exist.

Set-up is a handshake inside the transport, never seen by the service: the client's first message to a
shard is preceded by [OFFER, msgpack offer]; the server's transport answers [OFFER, msgpack answer]
itself, choosing at most one plane, and until that answer arrives every payload travels inline. A
descriptor a server cannot resolve (it restarted, or the plane broke) is answered with [RESET]: the
message is dropped, the client tears the plane down and offers again, and its retry re-sends inline.
The marks begin with 0xc1, a byte msgpack never uses, so no header can be mistaken for one.
"""
from __future__ import annotations

import abc
from typing import Hashable

OFFER = b"\xc1psrv-offer"
PAYLOAD = b"\xc1psrv-payload"
RESET = b"\xc1psrv-reset"
MARKS = (OFFER, PAYLOAD, RESET)
MIN_BYTES = 64 * 1024  # smaller tensor frames stay inline: a descriptor and a second path cost more


def is_mark(frame) -> bool:
    view = memoryview(frame)
    return view.nbytes < 32 and view.nbytes > 0 and view[0] == 0xC1 and bytes(view) in MARKS


class ClientPlane(abc.ABC):
    """A worker's side of one plane kind, for all its shards."""

    name: str

    @abc.abstractmethod
    def offer(self, shard: int) -> dict:
        """What this side offers shard `shard` (goes in the OFFER message under this plane's name)."""

    @abc.abstractmethod
    def accept(self, shard: int, answer: dict) -> None:
        """The server chose this plane for `shard`, with `answer` (its own part of the answer)."""

    @abc.abstractmethod
    def put(self, shard: int, payload: memoryview) -> bytes | None:
        """Move an outgoing payload; the descriptor that goes in its place in the zmq message, or None:
        it goes inline (the plane has no room for it now)."""

    @abc.abstractmethod
    def take(self, shard: int, descriptor: bytes, into: memoryview | None, *, hold: bool = False) -> memoryview | None:
        """The incoming payload `descriptor` names: written into `into` when given and of its size (the
        returned view is then `into`), else in a buffer of the plane's. None: it could not be read whole
        (overwritten while read, a broken connection); the message is then dropped as if lost. `hold`: a payload
        the shard names by place in its own memory may be returned where it lies, read-only, and held until
        release(shard) (ClientTransport.read_in_place)."""

    def release(self, shard: int) -> bool:
        """Done with the payload held from `shard` (take's `hold`); False if it changed while held."""
        return True

    def held(self, shard: int) -> int | None:
        """The address of the payload held from `shard`, or None."""
        return None

    def share(self, tensor):
        """`tensor`'s values where this plane can send them by place (see ClientTransport.share)."""
        return tensor

    def in_place(self, tensor) -> bool:
        """Whether the shard reads a payload of `tensor` where it lies (ClientTransport.in_place)."""
        return False

    def idle(self) -> None:
        """Every payload put so far was answered for (ClientTransport.idle)."""

    @abc.abstractmethod
    def reset(self, shard: int) -> None:
        """Forget the plane to `shard` (a reconnect, a RESET from the server)."""

    def close(self) -> None:
        pass


class ServerPlane(abc.ABC):
    """A shard's side of one plane kind, for all its peers."""

    name: str

    @abc.abstractmethod
    def answer(self, peer: Hashable, offer: dict, *, peer_address: str) -> dict | None:
        """This plane's answer to a peer's offer (its part of the OFFER answer), or None to decline.
        `peer_address` is the connection's remote address as zmq reports it ('' for ipc)."""

    @abc.abstractmethod
    def take(self, peer: Hashable, descriptor: bytes) -> memoryview | None:
        """The incoming payload `descriptor` names, valid until the next recv; None when it cannot be
        resolved (the peer has no plane here): the server transport then answers RESET."""

    @abc.abstractmethod
    def put(self, peer: Hashable, payload: memoryview) -> bytes | None:
        """Move an outgoing payload to `peer`; the descriptor, or None when `peer` has no plane here
        (the payload then goes inline)."""

    @abc.abstractmethod
    def forget(self, peer: Hashable) -> None:
        """Drop what this plane holds for `peer`."""

    def share(self, tensor):
        """`tensor`'s values where this plane can send them by place (see ServerTransport.share)."""
        return tensor

    def writing(self) -> None:
        """The service is about to write buffers it sent earlier (the shard's weights): a plane that
        still moves them out, or lets a peer read them in place, waits here or copies them first."""

    def written(self) -> None:
        """... and has written them (called at the transport's next send or recv)."""

    def released(self) -> None:
        """The payloads taken so far are read no more (called at the transport's next recv)."""

    def close(self) -> None:
        pass
