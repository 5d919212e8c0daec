"""ZeroMQ transport, a worker's side: a DEALER per shard (the shard's side, a ROUTER: psrv/transport/zmq.py), and
a replica's link to another replica of its shard (ZmqServer.link)."""
from __future__ import annotations

import time
from typing import Any, Sequence

import msgpack
import zmq

from psrv.transport.base import ClientTransport
from psrv.transport.curve import client_keys
from psrv.transport.plane import MIN_BYTES, OFFER, PAYLOAD, ClientPlane, is_mark
from psrv.transport.zmq_watch import Watch


def big(frames: Sequence[Any], *, headers: int = 1) -> bool:
    """A message whose last frame, its payload, may take a plane (plane.py): [header, payload]; with more
    `headers` allowed, [header frames..., payload] (a replica link's stream)."""
    return 2 <= len(frames) <= headers + 1 and memoryview(frames[-1]).nbytes >= MIN_BYTES


class ZmqClient(ClientTransport):
    """`curve_keys` + `curve_name`: connect with CURVE as that client (e.g. worker-3, admin). `planes`:
    the payload planes offered to every shard (the shard picks one, or none). `watch`: say when a shard's
    connection breaks (down; psrv/transport/zmq_watch.py), and return from recv at once when one does.
    `link`: a replica's link (ZmqServer.link): the last frame of a message of several header frames takes a
    plane too, and a message that goes inline is copied by send, not read from its buffers later."""

    in_order = True

    def __init__(self, addresses: Sequence[str], *, context: zmq.Context | None = None,
                 socket_options: dict[int, Any] | None = None, curve_keys: str = "", curve_name: str = "",
                 planes: Sequence[ClientPlane] = (), watch: bool = False, link: bool = False):
        self._ctx = context or zmq.Context.instance()
        self._addresses = list(addresses)
        self._link = link
        self._planes = {p.name: p for p in planes}
        self._plane: list[ClientPlane | None] = [None] * len(self._addresses)  # chosen by each shard
        self._offered = [False] * len(self._addresses)
        self._into: list[memoryview | None] = [None] * len(self._addresses)
        self._hold = [False] * len(self._addresses)  # read_in_place
        self._options = dict(socket_options or {})
        if curve_keys:
            server_public, public, secret = client_keys(curve_keys, curve_name)
            self._options.update({zmq.CURVE_SERVERKEY: server_public, zmq.CURVE_PUBLICKEY: public,
                                  zmq.CURVE_SECRETKEY: secret})
        self._socks: list[zmq.Socket] = [self._connect(a) for a in self._addresses]
        self._poller = zmq.Poller()
        self._wake: int | None = None  # wake_on's socket's fd
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
        planed = plane is not None and big(frames, headers=len(frames) if self._link else 1)
        descriptor = plane.put(shard, memoryview(frames[-1])) if planed else None
        if descriptor is None:
            self._send(shard, frames, copy=self._link)
        else:
            self._send(shard, [PAYLOAD, *frames[:-1], descriptor])

    def _send(self, shard: int, frames: Sequence[Any], *, copy: bool = False) -> None:
        try:
            self._socks[shard].send_multipart(frames, copy=copy, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def share(self, tensor):
        for plane in self._planes.values():
            tensor = plane.share(tensor)
        return tensor

    def in_place(self, shard: int, tensor) -> bool:
        plane = self._plane[shard]
        return plane is not None and plane.in_place(tensor)

    def receive_into(self, shard: int, buffer: memoryview | None) -> None:
        self._into[shard] = buffer

    def read_in_place(self, shard: int, on: bool) -> None:
        self._hold[shard] = on

    def held(self, shard: int) -> int | None:
        return None if self._plane[shard] is None else self._plane[shard].held(shard)

    def release(self, shard: int) -> bool:
        return all(plane.release(shard) for plane in self._planes.values())

    def idle(self) -> None:
        for plane in self._planes.values():
            plane.idle()

    def wake_on(self, sock) -> None:
        """recv returns None at once whenever `sock` (a socket object) is readable: how another thread ends this
        one's wait (psrv/client/heartbeat.py), instead of the wait running out."""
        self._poller.register(sock, zmq.POLLIN)
        self._wake = sock.fileno()  # how poll names a socket that is not zmq's

    def recv(self, timeout: float) -> tuple[int, list] | None:
        deadline = time.monotonic() + timeout
        while True:
            events = dict(self._poller.poll(int(max(0.0, deadline - time.monotonic()) * 1000)))
            if not events or (self._wake is not None and self._wake in events):
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
        if mark == PAYLOAD and len(frames) >= 3 and plane is not None:  # [PAYLOAD, header frames..., descriptor]
            into = self._into[shard]
            payload = plane.take(shard, frames[-1].bytes, into, hold=self._hold[shard])
            if payload is not None and payload is into:
                self._into[shard] = None
            return None if payload is None else [*(f.buffer for f in frames[1:-1]), payload]
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
