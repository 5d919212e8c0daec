"""One bulk connection between a worker and a shard: payloads out in order, read back in order.

Bytes go out on a sender thread, so a put never waits for the peer to read: the descriptor that tells
the peer to read them travels on zmq after put returns, and a peer that reads only on seeing it would
otherwise wait for a sender that waits for it. The reader (the transport's own thread) reads exactly
the bytes a descriptor names, in the order descriptors arrive. A payload stays the caller's memory
until sent; detach() copies what is left of it when the caller must write it (the shard's weights,
before an update). Every socket call has a timeout: a peer that makes no progress for `timeout`
seconds breaks the link, and the plane then falls back. A read has a deadline as well, `timeout` plus
the time its size takes at MIN_RATE: a peer that trickles (a byte now and then, each within the
timeout) would otherwise hold the reader, the shard's one thread, for as long as it likes.
"""
from __future__ import annotations

import collections
import select
import socket
import struct
import threading
import time

DESCRIPTOR = struct.Struct("!QQ")  # (sequence number, byte count)
BROKEN = DESCRIPTOR.pack(2**64 - 1, 0)  # what a put on a broken link sends: the reader resets the plane
TOKEN_BYTES = 16
READY = b"\x01"  # the shard's one-byte answer to a token it knows
CHUNK = 8 << 20  # the most one send() call copies, so detach() waits for at most this much
MIN_RATE = 1 << 20  # bytes per second: a payload read slower than this (after `timeout`) breaks the link


def tune(sock: socket.socket, timeout: float) -> None:
    """No Nagle delay for a payload's tail; a stalled peer costs at most `timeout` per call. The buffer
    sizes stay the kernel's (autotuned): 1 MB and 8 MB SO_RCVBUF/SO_SNDBUF measured no better on a
    64 MB PUSH_PULL (docs/benchmarks.md), and setting them turns autotuning off."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout)


def ready(sock: socket.socket, event: int, timeout: float) -> bool:
    """Whether `sock` is ready for `event` (POLLIN, POLLOUT) within `timeout` seconds; any error or
    hang-up counts as ready, so the call that follows reports it."""
    poller = select.poll()
    poller.register(sock, event)
    return bool(poller.poll(timeout * 1000))


def read_exactly(sock: socket.socket, view: memoryview, *, deadline: float | None = None) -> None:
    """Fill `view` from `sock`; ConnectionError if the peer closes first, TimeoutError if it stalls (for
    the socket's timeout) or the bytes are not all in by `deadline` (time.monotonic())."""
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    timeout = sock.gettimeout()
    got = 0
    try:
        while got < view.nbytes:
            if deadline is not None:  # the socket waits at most until the deadline
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the bulk peer sent too slowly: the payload was not in by its deadline")
                if timeout is None or left < timeout:
                    sock.settimeout(left)
            n = sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the bulk connection was closed by the peer")
            got += n
    finally:
        if deadline is not None:
            sock.settimeout(timeout)


def deadline_for(nbytes: int, timeout: float, min_rate: float = MIN_RATE) -> float:
    """When a read of `nbytes` must be done by: `timeout`, plus the time they take at `min_rate`."""
    return time.monotonic() + timeout + nbytes / min_rate


class Link:
    def __init__(self, sock: socket.socket, timeout: float, *, min_rate: float = MIN_RATE):
        tune(sock, timeout)
        self._sock = sock
        self._timeout = timeout
        self._min_rate = min_rate
        self._sent_seq = 0  # payloads handed to send()
        self._read_seq = 0  # payloads read
        self._pending: collections.deque[list] = collections.deque()  # [view, bytes sent, a copy of ours]
        self._lock = threading.Condition()
        self.broken = False
        self._thread = threading.Thread(target=self._sender, name="psrv-bulk-sender", daemon=True)
        self._thread.start()

    def send(self, payload: memoryview) -> bytes:
        """Queue `payload` (left untouched by the caller until detach()); its descriptor."""
        view = payload.cast("B") if payload.format != "B" or payload.ndim != 1 else payload
        with self._lock:
            if self.broken:
                return BROKEN
            seq = self._sent_seq
            self._sent_seq += 1
            self._pending.append([view, 0, False])
            self._lock.notify_all()
        return DESCRIPTOR.pack(seq, view.nbytes)

    def _sender(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending or self.broken)
                if self.broken:
                    return
                item = self._pending[0]
            try:
                self._send(item)
            except (OSError, ValueError):  # (ValueError: a socket closed meanwhile has no file descriptor)
                self.close()
                return
            with self._lock:
                self._pending.popleft()

    def _send(self, item: list) -> None:
        while True:
            with self._lock:
                if item[1] >= item[0].nbytes:
                    return
            if not ready(self._sock, select.POLLOUT, self._timeout):
                raise TimeoutError("the bulk peer read nothing for the timeout")
            with self._lock:  # held while the kernel copies a chunk (writable: no wait), never while waiting
                view, sent = item[0], item[1]
                item[1] = sent + self._sock.send(view[sent:sent + CHUNK])

    def detach(self) -> None:
        """Copy what is still unsent of every queued payload, so the caller may write the originals now:
        a slow reader costs a copy of what it has not read yet, never a wait."""
        with self._lock:
            for item in self._pending:
                view, sent, ours = item
                if not ours and sent < view.nbytes:
                    item[:] = [memoryview(bytes(view[sent:])), 0, True]

    def read(self, descriptor: bytes, into: memoryview) -> int:
        """Read the payload `descriptor` names into `into` (at least its size); its size, or -1 when the
        descriptor is out of order or the bytes could not be read (the link is then broken)."""
        try:
            seq, nbytes = DESCRIPTOR.unpack(descriptor)
        except struct.error:
            seq, nbytes = -1, 0
        if self.broken or seq != self._read_seq or nbytes > into.nbytes:
            self.close()
            return -1
        try:
            read_exactly(self._sock, into[:nbytes] if into.nbytes != nbytes else into,
                         deadline=deadline_for(nbytes, self._timeout, self._min_rate))
        except (OSError, ValueError):  # (ValueError: a socket closed meanwhile)
            self.close()
            return -1
        self._read_seq += 1
        return nbytes

    @staticmethod
    def size(descriptor: bytes) -> int:
        try:
            return DESCRIPTOR.unpack(descriptor)[1]
        except struct.error:
            return -1

    def closed_by_peer(self) -> bool:
        """True when the peer has closed its end (checked without reading what it sent)."""
        if self.broken:
            return True
        try:  # (a socket with a timeout waits for data before any recv, MSG_DONTWAIT or not: poll first)
            if not ready(self._sock, select.POLLIN, 0.0):
                return False
            return self._sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        with self._lock:
            if self.broken:
                return
            self.broken = True
            self._lock.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a reader or a sender waiting on the socket
        except OSError:
            pass
        self._sock.close()
