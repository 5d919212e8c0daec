"""ZeroMQ transport: a ROUTER per shard on the server, a DEALER per shard on the worker.

Big messages are cheapest with the allocator tuned by psrv.process.tune_malloc, which psrv's own
entry points call; a library user may call it too (it is process-wide, so it is never done here).
"""
from __future__ import annotations

import time
from typing import Any, Hashable, Sequence

import zmq

from psrv.transport.curve import client_keys, server_pair, start_authenticator
from psrv.transport.base import ClientTransport, ServerTransport


def _resolve_bind(bind: str) -> str:
    # zmq spells "any free port" as '*'; psrv accepts the usual :0 as well.
    return bind[:-2] + ":*" if bind.endswith(":0") else bind


class ZmqServer(ServerTransport):
    """With `curve_keys` (a `psrv keygen` directory) every connection is CURVE-encrypted and only
    allow-listed clients get through; `authenticated` then tells the service so."""

    def __init__(self, bind: str, *, max_message_bytes: int = -1, context: zmq.Context | None = None,
                 curve_keys: str = ""):
        self._own_ctx = bool(curve_keys) and context is None  # one ZAP handler per context
        self._ctx = zmq.Context() if self._own_ctx else (context or zmq.Context.instance())
        self._auth = None
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # replies to vanished peers are dropped
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
        if not self._poller.poll(int(timeout * 1000)):
            return None
        frames = self._sock.recv_multipart(copy=False)
        return frames[0].bytes, [f.buffer for f in frames[1:]]

    def send(self, peer: Hashable, frames: Sequence[Any]) -> None:
        big = len(frames) > 1 and memoryview(frames[-1]).nbytes >= zmq.COPY_THRESHOLD
        tracker = self._sock.send_multipart([peer, *frames], copy=False, track=big)
        if big:
            self._trackers.append(tracker)

    def wait_sent(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while self._trackers:
            try:
                self._trackers[-1].wait(max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                return False
            self._trackers.pop()
        return True

    def close(self) -> None:
        self._sock.close(linger=200)  # the last answers (a LEAVE's OK) still go out; a dead peer costs 0.2s
        if self._auth is not None:
            self._auth.stop()
        if self._own_ctx:
            self._ctx.term()


class ZmqClient(ClientTransport):
    """`curve_keys` + `curve_name`: connect with CURVE as that client (e.g. worker-3, admin)."""

    def __init__(self, addresses: Sequence[str], *, context: zmq.Context | None = None,
                 socket_options: dict[int, Any] | None = None, curve_keys: str = "", curve_name: str = ""):
        self._ctx = context or zmq.Context.instance()
        self._addresses = list(addresses)
        self._options = dict(socket_options or {})
        if curve_keys:
            server_public, public, secret = client_keys(curve_keys, curve_name)
            self._options.update({zmq.CURVE_SERVERKEY: server_public, zmq.CURVE_PUBLICKEY: public,
                                  zmq.CURVE_SECRETKEY: secret})
        self._socks: list[zmq.Socket] = [self._connect(a) for a in self._addresses]
        self._poller = zmq.Poller()
        for s in self._socks:
            self._poller.register(s, zmq.POLLIN)

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
        try:
            self._socks[shard].send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def recv(self, timeout: float) -> tuple[int, list] | None:
        events = dict(self._poller.poll(int(timeout * 1000)))
        for shard, sock in enumerate(self._socks):
            if sock in events:
                frames = sock.recv_multipart(copy=False)
                return shard, [f.buffer for f in frames]
        return None

    def reconnect(self, shard: int) -> None:
        old = self._socks[shard]
        self._poller.unregister(old)
        old.close(linger=0)
        self._socks[shard] = self._connect(self._addresses[shard])
        self._poller.register(self._socks[shard], zmq.POLLIN)

    def close(self) -> None:
        for s in self._socks:
            s.close(linger=0)
