"""The bulk plane: tensor payloads between hosts on a plain TCP connection, read with recv_into.

ZeroMQ keeps every control message; a payload of at least plane.MIN_BYTES goes on one TCP connection
per worker and shard (psrv/transport/bulk_link.py) and is read straight into its destination: the
worker's weights buffer (ClientTransport.receive_into), or on the shard one receive buffer, kept and
grown to the largest payload (a payload is valid until the transport's next recv, and the service
has applied or accumulated it by then: one buffer for all workers, not one each). Set-up:
the shard listens on one socket of the host its zmq socket binds (127.0.0.1 stays 127.0.0.1); its
answer to an offer is {"port", "token"}; the worker connects to the shard's zmq host on that port and
sends the token first, which ties the connection to the worker's zmq peer.

Security: the connection is neither encrypted nor authenticated beyond the token, which travels on
the zmq connection. So the bulk path is for trusted networks, and never runs under CURVE
(psrv serve and psrv.Worker turn it off when --curve-keys are given).
"""
from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from typing import Hashable, Sequence

from psrv.transport.bulk_link import BROKEN, MIN_RATE, READY, TOKEN_BYTES, Link, deadline_for, read_exactly, tune
from psrv.transport.plane import ClientPlane, ServerPlane

log = logging.getLogger(__name__)
TIMEOUT = 10.0  # seconds without progress before a bulk connection counts as dead
RETRY_AFTER = 300.0  # a worker that could not connect (a firewall?) offers the bulk plane again after this long


def tcp_host(address: str) -> str | None:
    """The host of a zmq tcp:// address ('' for any interface), None for other kinds (ipc://)."""
    if not address.startswith("tcp://"):
        return None
    host = address[len("tcp://"):].rsplit(":", 1)[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return "" if host in ("*", "0.0.0.0") else host


class BulkServerPlane(ServerPlane):
    """A shard's bulk plane: `bind` is the shard's zmq bind address (its host is the one listened on);
    a descriptor naming more than `max_bytes` (> 0) is refused before anything is allocated. A payload
    must come in within `timeout` plus its size at `min_rate` bytes/s (bulk_link.py), or is answered RESET."""

    name = "bulk"

    def __init__(self, bind: str = "tcp://127.0.0.1:0", *, timeout: float = TIMEOUT, max_bytes: int = -1,
                 min_rate: float = MIN_RATE):
        self._timeout = timeout
        self._min_rate = min_rate
        self._max_bytes = max_bytes
        self._tokens: dict[bytes, Hashable] = {}
        self._links: dict[Hashable, Link] = {}
        self._buffer = bytearray()  # every payload is read here: it is valid until the next recv only
        self._lock = threading.Condition()
        self._closed = False
        self.bytes_in = self.bytes_out = 0  # payload bytes moved on bulk connections
        self._listener: socket.socket | None = None
        host = tcp_host(bind)
        if host is None:
            return  # ipc: nothing remote to serve
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family, backlog=64)
        self._listener.settimeout(0.5)  # the acceptor checks for close() this often
        self.port = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="psrv-bulk-accept", daemon=True)
        self._acceptor.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                self._admit(conn)
            except OSError:
                conn.close()

    def _admit(self, conn: socket.socket) -> None:
        """Tie a new connection to the peer whose token it sends first, and say so (READY): the worker
        waits for that before its first put, so take() never has to wait for a connection."""
        wait = min(self._timeout, 2.0)  # one silent or trickling connector holds the others up this long
        conn.settimeout(wait)
        address = conn.getpeername()[0]
        token = bytearray(TOKEN_BYTES)
        read_exactly(conn, memoryview(token), deadline=deadline_for(0, wait))
        with self._lock:  # held while READY goes out (one byte, to an empty buffer): no put comes first
            peer = self._tokens.pop(bytes(token), None)
            if peer is None or self._closed:
                conn.close()
                return
            conn.sendall(READY)
            self._links[peer] = Link(conn, self._timeout, min_rate=self._min_rate)
        log.info("bulk connection from %s on port %d", address, self.port)

    def answer(self, peer: Hashable, offer: dict, *, peer_address: str) -> dict | None:
        if self._listener is None or offer.get("declined"):
            return None
        self.forget(peer)
        self._sweep()
        token = secrets.token_bytes(TOKEN_BYTES)
        with self._lock:
            self._tokens[token] = peer
        return {"port": self.port, "token": token}

    def _sweep(self) -> None:
        """Drop the links of workers that went away (closed their end) without a word on zmq."""
        with self._lock:
            gone = [peer for peer, link in self._links.items() if link.closed_by_peer()]
        for peer in gone:
            self.forget(peer)

    def _link(self, peer: Hashable) -> Link | None:
        with self._lock:
            link = self._links.get(peer)
        return None if link is None or link.broken else link

    def take(self, peer: Hashable, descriptor: bytes) -> memoryview | None:
        size = Link.size(descriptor)
        refused = size < 0 or descriptor == BROKEN or 0 < self._max_bytes < size
        link = None if refused else self._link(peer)
        if link is None:
            self.forget(peer)
            return None
        if len(self._buffer) < size:
            self._buffer = bytearray(size)
        view = memoryview(self._buffer)[:size]
        if link.read(descriptor, view) < 0:
            log.warning("bulk connection of a worker broke; its payloads go through zmq until it offers again")
            self.forget(peer)
            return None
        self.bytes_in += size
        return view

    def put(self, peer: Hashable, payload: memoryview) -> bytes | None:
        link = self._link(peer)
        if link is None:
            return None
        self.bytes_out += payload.nbytes
        return link.send(payload)

    def writing(self) -> None:
        """Payloads still going out to slow readers are copied (what is left of them), never waited for."""
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.detach()

    def forget(self, peer: Hashable) -> None:
        with self._lock:
            for token in [t for t, p in self._tokens.items() if p == peer]:
                del self._tokens[token]
            link = self._links.pop(peer, None)
        if link is not None:
            link.close()

    def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()


class BulkClientPlane(ClientPlane):
    """A worker's bulk plane: `addresses` are the shards' zmq addresses, in shard order; `timeout` and
    `min_rate` as the shard's."""

    name = "bulk"

    def __init__(self, addresses: Sequence[str], *, timeout: float = TIMEOUT, min_rate: float = MIN_RATE):
        self._hosts = [tcp_host(a) for a in addresses]
        self._timeout = timeout
        self._min_rate = min_rate
        self._links: dict[int, Link] = {}
        self._failed: dict[int, float] = {}  # shard -> when connecting failed
        self.bytes_in = self.bytes_out = 0  # payload bytes moved on bulk connections

    def offer(self, shard: int) -> dict:
        failed = self._failed.get(shard)
        if self._hosts[shard] is None or (failed is not None and time.monotonic() - failed < RETRY_AFTER):
            return {"declined": True}
        return {}

    def accept(self, shard: int, answer: dict) -> None:
        self.reset(shard)
        sock = None
        try:
            host = self._hosts[shard] or "127.0.0.1"
            sock = socket.create_connection((host, int(answer["port"])), timeout=self._timeout)
            tune(sock, self._timeout)
            sock.sendall(bytes(answer["token"]))
            ready = bytearray(1)
            read_exactly(sock, memoryview(ready))  # the shard has tied this connection to us
            if bytes(ready) != READY:
                raise ConnectionError("the shard did not know the token")
        except (OSError, KeyError, TypeError, ValueError) as exc:
            log.warning("cannot open the bulk connection to shard %d (%s); tensors go through zmq", shard, exc)
            self._failed[shard] = time.monotonic()
            if sock is not None:
                sock.close()
            return
        self._failed.pop(shard, None)
        self._links[shard] = Link(sock, self._timeout, min_rate=self._min_rate)

    def put(self, shard: int, payload: memoryview) -> bytes:
        link = self._links.get(shard)
        if link is None or link.broken:
            return BROKEN
        self.bytes_out += payload.nbytes
        return link.send(payload)

    def take(self, shard: int, descriptor: bytes, into: memoryview | None, *, hold: bool = False) -> memoryview | None:
        link, size = self._links.get(shard), Link.size(descriptor)
        if link is None or size < 0:
            return None
        target = into if into is not None and into.nbytes == size else memoryview(bytearray(size))
        if link.read(descriptor, target) < 0:
            self.reset(shard)  # the next put says BROKEN: the shard answers RESET and a new offer follows
            return None
        self.bytes_in += size
        return target

    def reset(self, shard: int) -> None:
        link = self._links.pop(shard, None)
        if link is not None:
            link.close()

    def close(self) -> None:
        for shard in list(self._links):
            self.reset(shard)
