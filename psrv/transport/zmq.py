"""ZeroMQ transport: a ROUTER per shard on the server, a DEALER per shard on the worker (psrv/transport/zmq_client.py).

Big messages are cheapest with the allocator tuned by psrv.process.tune_malloc, which psrv's own
entry points call; a library user may call it too (it is process-wide, so it is never done here).
"""
from __future__ import annotations

import time
import weakref
from typing import Any, Callable, Hashable, Sequence

import msgpack
import zmq

from psrv.transport.curve import server_pair, start_authenticator
from psrv.transport.base import ClientTransport, ServerTransport
from psrv.transport.plane import OFFER, PAYLOAD, RESET, ClientPlane, ServerPlane, is_mark
from psrv.transport.zmq_client import ZmqClient, big

__all__ = ["ZmqClient", "ZmqServer"]


RECEIVE_QUEUE = 4  # messages per peer a shard's socket receives ahead of its loop


def _abandon(parts: dict) -> None:
    """What a ZmqServer that was never closed holds, released in order: its socket (at once, linger 0), its
    authenticator, then its own context (None: a shared one)."""
    parts["sock"].close(linger=0)
    if parts["auth"] is not None:
        parts["auth"].stop()
    if parts["ctx"] is not None:
        parts["ctx"].term()


def _resolve_bind(bind: str) -> str:
    # zmq spells "any free port" as '*'; psrv accepts the usual :0 as well.
    return bind[:-2] + ":*" if bind.endswith(":0") else bind


class ZmqServer(ServerTransport):
    """With `curve_keys` (a `psrv keygen` directory) every connection is CURVE-encrypted and only
    allow-listed clients get through; `authenticated` then tells the service so. `planes`: the payload
    planes (psrv/transport/plane.py) this shard answers offers for, in order of preference."""

    def __init__(self, bind: str, *, max_message_bytes: int = -1, context: zmq.Context | None = None,
                 curve_keys: str = "", planes: Sequence[ServerPlane] = (),
                 link_planes: Callable[[], Sequence[ClientPlane]] = tuple):
        self._planes = list(planes)
        self._link_planes = link_planes  # a link's planes (link): a backup on this host is sent the stream by shm
        self._peer_plane: dict[bytes, ServerPlane] = {}
        self.payload_bytes = {"inline": 0, **{p.name: 0 for p in self._planes}}  # tensor bytes by the path they took
        # A context of its own (one ZAP handler per context with CURVE), so that close() can wait for the last
        # replies to leave: a socket's linger runs in its context's I/O thread, which dies with the process, and a
        # forked shard ends with os._exit (psrv/cli/zygote.py). inproc:// binds share the clients' context.
        self._own_ctx = context is None and not bind.startswith("inproc://")
        self._ctx = zmq.Context() if self._own_ctx else (context or zmq.Context.instance())
        self._auth = None
        self._sock = self._ctx.socket(zmq.ROUTER)
        # a server dropped without close() (a test's shard left to the collector) closes its socket before its
        # context ends: a collection that finalised the context first blocked in term() on the open socket
        self._parts: dict[str, Any] = {"sock": self._sock, "ctx": self._ctx if self._own_ctx else None, "auth": None}
        self._abandon = weakref.finalize(self, _abandon, self._parts)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # replies to vanished peers are dropped
        # A few messages queued per peer, then zmq stops reading its connection until the shard takes one:
        # a push in chunks (psrv/server/pushes/chunked.py) then holds a few chunks here, not all of them
        self._sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        if max_message_bytes > 0:  # a bigger message drops the sender's connection unread
            self._sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.authenticated = bool(curve_keys)
        if curve_keys:
            self._auth = self._parts["auth"] = start_authenticator(self._ctx, curve_keys)
            public, secret = server_pair(curve_keys)
            self._sock.curve_publickey, self._sock.curve_secretkey = public, secret
            self._sock.curve_server = True
        self._bind(bind)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._trackers: list[zmq.MessageTracker] = []

    def _bind(self, bind: str) -> None:
        """Bind, or close what was opened and raise ValueError saying what to change."""
        try:
            self._sock.bind(_resolve_bind(bind))
        except zmq.ZMQError as exc:
            self.close()
            if exc.errno == zmq.EADDRINUSE:
                raise ValueError(f"{bind} is already in use (another psrv serve?); pick another --bind port "
                                 "or port 0") from None
            raise ValueError(f"cannot bind {bind}: {exc.strerror}; --bind takes tcp://HOST:PORT "
                             "(port 0: a free port)") from None

    def recv(self, timeout: float) -> tuple[Hashable, list] | None:
        """A plane's OFFER is answered here and gives None (as a timeout would); a PAYLOAD message comes
        back as [header, payload], its payload fetched by the peer's plane."""
        self._written()
        for plane in self._planes:
            plane.released()
        if not self._poller.poll(int(timeout * 1000)):
            return None
        frames = self._sock.recv_multipart(copy=False)
        peer = frames[0].bytes
        if len(frames) > 1 and is_mark(frames[1]):
            return self._planed(peer, frames)
        if len(frames) == 3:
            self.payload_bytes["inline"] += len(frames[2])
        return peer, [f.buffer for f in frames[1:]]

    def _planed(self, peer: bytes, frames: list) -> tuple[Hashable, list] | None:
        mark = frames[1].bytes
        if mark == PAYLOAD and len(frames) >= 4:  # [peer, PAYLOAD, header frames..., descriptor]
            plane = self._peer_plane.get(peer)
            payload = None if plane is None else plane.take(peer, frames[-1].bytes)
            if payload is not None:
                self.payload_bytes[plane.name] += payload.nbytes
                return peer, [*(f.buffer for f in frames[2:-1]), payload]
        elif mark == OFFER and len(frames) == 3:
            self._answer(peer, frames[2])
            return None
        self._sock.send_multipart([peer, RESET])  # a payload nobody here can fetch: the client offers again
        return None

    def _answer(self, peer: bytes, offer_frame) -> None:
        try:
            offer = msgpack.unpackb(offer_frame.bytes, raw=False)
        except Exception:  # garbage is declined like an offer of nothing
            offer = {}
        old = self._peer_plane.pop(peer, None)
        if old is not None:
            old.forget(peer)
        answer: dict = {"plane": None}
        address = offer_frame.get("Peer-Address") or ""
        for plane in self._planes:
            mine = plane.answer(peer, offer[plane.name], peer_address=address) \
                if isinstance(offer, dict) and isinstance(offer.get(plane.name), dict) else None
            if mine is not None:
                self._peer_plane[peer] = plane
                answer = {"plane": plane.name, plane.name: mine}
                break
        self._sock.send_multipart([peer, OFFER, msgpack.packb(answer)])

    def share(self, tensor):
        for plane in self._planes:
            tensor = plane.share(tensor)
        return tensor

    def _written(self) -> None:
        """The service calls wait_sent() before it writes what it sent, and has written by its next call."""
        for plane in self._planes:
            plane.written()

    def send(self, peer: Hashable, frames: Sequence[Any]) -> None:
        self._written()
        plane = self._peer_plane.get(peer) if self._peer_plane else None
        if plane is not None and big(frames):
            descriptor = plane.put(peer, memoryview(frames[-1]))
            if descriptor is not None:
                self.payload_bytes[plane.name] += memoryview(frames[-1]).nbytes
                self._sock.send_multipart([peer, PAYLOAD, *frames[:-1], descriptor])
                return
        if len(frames) == 2:
            self.payload_bytes["inline"] += memoryview(frames[1]).nbytes
        tracked = len(frames) > 1 and memoryview(frames[-1]).nbytes >= zmq.COPY_THRESHOLD
        tracker = self._sock.send_multipart([peer, *frames], copy=False, track=tracked)
        if tracked:
            self._trackers.append(tracker)

    def wait_sent(self, timeout: float = 30.0) -> bool:
        for plane in self._planes:  # shared memory waits for its readers; bulk copies what it has yet to send
            plane.writing()
        deadline = time.monotonic() + timeout
        while self._trackers:
            try:
                self._trackers[-1].wait(max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                return False
            self._trackers.pop()
        return True

    def link(self, address: str) -> ClientTransport:
        """A line to another replica of this shard (the replication stream): a DEALER to `address` offering the
        planes this shard's workers may use (a backup on this host then reads each forwarded payload from shared
        memory, one memcpy, not a TCP round of the kernel's). A payload that goes inline is copied when sent,
        as is one a plane takes: the caller may change or release its buffer at once (the shard does, at its
        next receive, psrv/transport/shm.py), without waiting for the backup's ack."""
        return ZmqClient([address], planes=self._link_planes(), link=True, watch=True)  # a broken one is seen

    def close(self) -> None:
        self._abandon.detach()
        self._sock.close(linger=200)  # the last answers (a LEAVE's OK) still go out; a dead peer costs 0.2s
        # (term, below, waits for them: without it a process that exits at once lost 4 of 30 LEAVE answers)
        for plane in self._planes:
            plane.close()
        if self._auth is not None:
            self._auth.stop()
        if self._own_ctx:
            self._ctx.term()
