"""ZeroMQ transport: a ROUTER per shard on the server, a DEALER per shard on the worker.

Big messages are cheapest with the allocator tuned by psrv.process.tune_malloc, which psrv's own
entry points call; a library user may call it too (it is process-wide, so it is never done here).
"""
from __future__ import annotations

import time
from typing import Any, Hashable, Sequence

import msgpack
import zmq

from psrv.transport.curve import client_keys, server_pair, start_authenticator
from psrv.transport.base import ClientTransport, ServerTransport
from psrv.transport.plane import MIN_BYTES, OFFER, PAYLOAD, RESET, ClientPlane, ServerPlane, is_mark
from psrv.transport.zmq_watch import Watch


RECEIVE_QUEUE = 4  # messages per peer a shard's socket receives ahead of its loop


def _resolve_bind(bind: str) -> str:
    # zmq spells "any free port" as '*'; psrv accepts the usual :0 as well.
    return bind[:-2] + ":*" if bind.endswith(":0") else bind


def _big(frames: Sequence[Any]) -> bool:
    return len(frames) == 2 and memoryview(frames[1]).nbytes >= MIN_BYTES


class ZmqServer(ServerTransport):
    """With `curve_keys` (a `psrv keygen` directory) every connection is CURVE-encrypted and only
    allow-listed clients get through; `authenticated` then tells the service so. `planes`: the payload
    planes (psrv/transport/plane.py) this shard answers offers for, in order of preference."""

    def __init__(self, bind: str, *, max_message_bytes: int = -1, context: zmq.Context | None = None,
                 curve_keys: str = "", planes: Sequence[ServerPlane] = ()):
        self._planes = list(planes)
        self._peer_plane: dict[bytes, ServerPlane] = {}
        self.payload_bytes = {"inline": 0, **{p.name: 0 for p in self._planes}}  # tensor bytes by the path they took
        self._own_ctx = bool(curve_keys) and context is None  # one ZAP handler per context
        self._ctx = zmq.Context() if self._own_ctx else (context or zmq.Context.instance())
        self._auth = None
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # replies to vanished peers are dropped
        # A few messages queued per peer, then zmq stops reading its connection until the shard takes one:
        # a push in chunks (psrv/server/chunked.py) then holds a few chunks here, not all of them
        self._sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        if max_message_bytes > 0:  # a bigger message drops the sender's connection unread
            self._sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.authenticated = bool(curve_keys)
        if curve_keys:
            self._auth = start_authenticator(self._ctx, curve_keys)
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
        if mark == PAYLOAD and len(frames) == 4:
            plane = self._peer_plane.get(peer)
            payload = None if plane is None else plane.take(peer, frames[3].bytes)
            if payload is not None:
                self.payload_bytes[plane.name] += payload.nbytes
                return peer, [frames[2].buffer, payload]
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
        if plane is not None and _big(frames):
            descriptor = plane.put(peer, memoryview(frames[1]))
            if descriptor is not None:
                self.payload_bytes[plane.name] += memoryview(frames[1]).nbytes
                self._sock.send_multipart([peer, PAYLOAD, frames[0], descriptor])
                return
        if len(frames) == 2:
            self.payload_bytes["inline"] += memoryview(frames[1]).nbytes
        big = len(frames) > 1 and memoryview(frames[-1]).nbytes >= zmq.COPY_THRESHOLD
        tracker = self._sock.send_multipart([peer, *frames], copy=False, track=big)
        if big:
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
        """A line to another replica of this shard (the replication stream): a plain DEALER to `address`."""
        return ZmqClient([address])

    def close(self) -> None:
        self._sock.close(linger=200)  # the last answers (a LEAVE's OK) still go out; a dead peer costs 0.2s
        for plane in self._planes:
            plane.close()
        if self._auth is not None:
            self._auth.stop()
        if self._own_ctx:
            self._ctx.term()


class ZmqClient(ClientTransport):
    """`curve_keys` + `curve_name`: connect with CURVE as that client (e.g. worker-3, admin). `planes`:
    the payload planes offered to every shard (the shard picks one, or none). `watch`: say when a shard's
    connection breaks (down; psrv/transport/zmq_watch.py), and return from recv at once when one does."""

    def __init__(self, addresses: Sequence[str], *, context: zmq.Context | None = None,
                 socket_options: dict[int, Any] | None = None, curve_keys: str = "", curve_name: str = "",
                 planes: Sequence[ClientPlane] = (), watch: bool = False):
        self._ctx = context or zmq.Context.instance()
        self._addresses = list(addresses)
        self._planes = {p.name: p for p in planes}
        self._plane: list[ClientPlane | None] = [None] * len(self._addresses)  # chosen by each shard
        self._offered = [False] * len(self._addresses)
        self._into: list[memoryview | None] = [None] * len(self._addresses)
        self._options = dict(socket_options or {})
        if curve_keys:
            server_public, public, secret = client_keys(curve_keys, curve_name)
            self._options.update({zmq.CURVE_SERVERKEY: server_public, zmq.CURVE_PUBLICKEY: public,
                                  zmq.CURVE_SECRETKEY: secret})
        self._socks: list[zmq.Socket] = [self._connect(a) for a in self._addresses]
        self._poller = zmq.Poller()
        self._watch = Watch(self._poller) if watch else None
        for shard, s in enumerate(self._socks):
            self._poller.register(s, zmq.POLLIN)
            if self._watch is not None:
                self._watch.add(shard, s)

    def _connect(self, address: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        for opt, value in self._options.items():
            sock.setsockopt(opt, value)
        sock.connect(address)
        return sock

    def send(self, shard: int, frames: Sequence[Any]) -> None:
        """Never blocks: with no usable connection (a CURVE handshake refused, a full queue) the
        message is dropped, and the client's retry sends it again on a fresh connection."""
        if self._planes and not self._offered[shard]:
            self._offered[shard] = True
            offer = {name: p.offer(shard) for name, p in self._planes.items()}
            self._send(shard, [OFFER, msgpack.packb(offer)])
        plane = self._plane[shard]
        descriptor = plane.put(shard, memoryview(frames[1])) if plane is not None and _big(frames) else None
        self._send(shard, frames if descriptor is None else [PAYLOAD, frames[0], descriptor])

    def _send(self, shard: int, frames: Sequence[Any]) -> None:
        try:
            self._socks[shard].send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def share(self, tensor):
        for plane in self._planes.values():
            tensor = plane.share(tensor)
        return tensor

    def receive_into(self, shard: int, buffer: memoryview | None) -> None:
        self._into[shard] = buffer

    def idle(self) -> None:
        for plane in self._planes.values():
            plane.idle()

    def recv(self, timeout: float) -> tuple[int, list] | None:
        deadline = time.monotonic() + timeout
        while True:
            events = dict(self._poller.poll(int(max(0.0, deadline - time.monotonic()) * 1000)))
            if not events:
                return None
            broke = self._watch is not None and self._watch.read(events)
            for shard, sock in enumerate(self._socks):
                if sock in events:
                    frames = sock.recv_multipart(copy=False)
                    got = self._unplaned(shard, frames) if is_mark(frames[0]) else [f.buffer for f in frames]
                    if got is not None:
                        return shard, got
            if broke:  # the caller looks at down() now
                return None

    def down(self, shard: int) -> bool:
        return self._watch is not None and self._watch.down(shard)

    def _unplaned(self, shard: int, frames: list) -> list | None:
        """A PAYLOAD message as [header, payload]; None for the plane's own messages (an OFFER's answer,
        a RESET) and for a payload its plane could not read whole (dropped, as a lost message is)."""
        mark, plane = frames[0].bytes, self._plane[shard]
        if mark == PAYLOAD and len(frames) == 3 and plane is not None:
            into = self._into[shard]
            payload = plane.take(shard, frames[2].bytes, into)
            if payload is not None and payload is into:
                self._into[shard] = None
            return None if payload is None else [frames[1].buffer, payload]
        if mark == OFFER and len(frames) == 2:
            try:
                answer = msgpack.unpackb(frames[1].bytes, raw=False)
                chosen = self._planes.get(answer.get("plane") or "")
                mine = answer[chosen.name] if chosen is not None else None
            except Exception:  # an answer that makes no sense: no plane, everything inline
                chosen, mine = None, None
            if isinstance(mine, dict):
                chosen.accept(shard, mine)
                self._plane[shard] = chosen
            return None
        self._drop_plane(shard)  # RESET, or a payload with no plane: offer again with the next message
        return None

    def _drop_plane(self, shard: int) -> None:
        if self._plane[shard] is not None:
            self._plane[shard].reset(shard)
        self._plane[shard], self._offered[shard], self._into[shard] = None, False, None

    def reconnect(self, shard: int) -> None:
        self._drop_plane(shard)
        old = self._socks[shard]
        if self._watch is not None:
            self._watch.remove(shard, old)
        self._poller.unregister(old)
        old.close(linger=0)
        self._socks[shard] = self._connect(self._addresses[shard])
        self._poller.register(self._socks[shard], zmq.POLLIN)
        if self._watch is not None:
            self._watch.add(shard, self._socks[shard])

    def redirect(self, shard: int, address: str) -> None:
        self._addresses[shard] = address
        self.reconnect(shard)

    def close(self) -> None:
        for shard, s in enumerate(self._socks):
            if self._watch is not None:
                self._watch.remove(shard, s)
            s.close(linger=0)
        for plane in self._planes.values():
            plane.close()
