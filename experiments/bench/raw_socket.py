"""The remote hosts' physical baseline: a plain TCP socket echo, each side reading with recv_into.

The bulk plane (psrv/transport/bulk.py) is measured against this, so it uses the socket module only
and nothing of psrv: a message is an 8-byte length and the bytes; the server reads them into one
buffer it keeps (grown when needed) and sends them back, the client reads the echo into its own.
Run as a process: python -m psrv.experiments.bench.raw_socket HOST READY_FILE
"""
from __future__ import annotations

import socket
import struct
import sys
import time
from pathlib import Path

_LENGTH = struct.Struct("!Q")


def read_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < view.nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the peer closed the connection")
        got += n


def echo_server(host: str, ready: Path) -> None:
    with socket.create_server((host, 0)) as listener:
        ready.write_text(f"{host}:{listener.getsockname()[1]}")
        conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray()
    head = bytearray(_LENGTH.size)
    with conn:
        while True:
            read_exactly(conn, memoryview(head))
            (size,) = _LENGTH.unpack(head)
            if size == 0:
                break
            if len(buffer) < size:
                buffer = bytearray(size)
            view = memoryview(buffer)[:size]
            read_exactly(conn, view)
            conn.sendall(head)
            conn.sendall(view)


class EchoClient:
    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._head = bytearray(_LENGTH.size)

    def round_trip(self, payload, out) -> float:
        """Send `payload`, read its echo into `out` (both buffers of the same size); seconds taken."""
        data, into = memoryview(payload).cast("B"), memoryview(out).cast("B")
        t0 = time.perf_counter()
        self.sock.sendall(_LENGTH.pack(data.nbytes))
        self.sock.sendall(data)
        read_exactly(self.sock, memoryview(self._head))
        read_exactly(self.sock, into[:_LENGTH.unpack(self._head)[0]])
        return time.perf_counter() - t0

    def stop(self) -> None:
        self.sock.sendall(_LENGTH.pack(0))
        self.sock.close()


if __name__ == "__main__":
    echo_server(sys.argv[1], Path(sys.argv[2]))
