"""A zmq client told to watch its connections (psrv/transport/zmq_watch.py) says at once that a shard's connection
broke, and its recv returns then instead of waiting out its timeout: a worker moves to the shard's backup the
moment its primary's process ends, not once a probe goes unanswered (psrv/client/roundtrip.py)."""
from __future__ import annotations

import time

from psrv.transport.zmq import ZmqClient, ZmqServer


def _connected(client: ZmqClient, server: ZmqServer) -> None:
    client.send(0, [b"hello"])
    got = server.recv(10.0)
    assert got is not None and bytes(got[1][0]) == b"hello"


def test_a_watching_client_sees_its_shard_close_at_once_and_a_reconnect_clears_it():
    server = ZmqServer("tcp://127.0.0.1:0")
    client = ZmqClient([server.address], watch=True)
    try:
        _connected(client, server)
        assert not client.down(0)
        server.close()
        started = time.monotonic()
        while not client.down(0):
            assert client.recv(30.0) is None  # it returns when the connection breaks, long before 30 s
            assert time.monotonic() - started < 10.0
        client.reconnect(0)  # (a redirect: a fresh connection, watched afresh)
        assert not client.down(0)
    finally:
        client.close()


def test_a_client_that_does_not_watch_never_says_down():
    server = ZmqServer("tcp://127.0.0.1:0")
    client = ZmqClient([server.address])
    try:
        _connected(client, server)
        server.close()
        assert client.recv(0.3) is None and not client.down(0)
    finally:
        client.close()
