"""Which of a zmq client's connections broke (psrv/transport/zmq.py, ClientTransport.down): a socket monitor per
shard, whose DISCONNECTED event comes the moment the peer's process ends (the kernel closes a killed process's
sockets), long before a probe of it could go unanswered."""
from __future__ import annotations

import itertools
import os

import zmq
from zmq.utils.monitor import recv_monitor_message

EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
_NAMES = itertools.count()  # each monitor's own inproc endpoint (next() is atomic under the GIL)


class Watch:
    """The monitors of a client's sockets, polled with them by `poller`."""

    def __init__(self, poller: zmq.Poller):
        self._poller = poller
        self._monitors: dict[int, zmq.Socket] = {}  # shard -> the monitor of its socket
        self._down: set[int] = set()

    def add(self, shard: int, sock: zmq.Socket) -> None:
        # pyzmq's default endpoint is named by the socket's file descriptor, which a socket opened by another
        # thread of this process may take over from one just closed: a name of its own can never be another's
        monitor = sock.get_monitor_socket(EVENTS, addr=f"inproc://psrv-watch-{os.getpid()}-{next(_NAMES)}")
        self._monitors[shard] = monitor
        self._poller.register(monitor, zmq.POLLIN)

    def remove(self, shard: int, sock: zmq.Socket) -> None:
        """Before `sock` closes (a reconnect: its successor is watched afresh)."""
        self._down.discard(shard)
        monitor = self._monitors.pop(shard, None)
        if monitor is not None:
            self._poller.unregister(monitor)
            sock.disable_monitor()
            monitor.close(linger=0)

    def read(self, events: dict) -> bool:
        """Take the monitors' events among a poll's `events`; True if a connection broke."""
        broke = False
        for shard, monitor in self._monitors.items():
            if monitor not in events:
                continue
            while True:
                try:
                    event = recv_monitor_message(monitor, flags=zmq.NOBLOCK)["event"]
                except zmq.Again:
                    break
                if event == zmq.EVENT_DISCONNECTED:
                    self._down.add(shard)
                    broke = True
                elif event == zmq.EVENT_CONNECTED:  # it came back (a process restarted at that address)
                    self._down.discard(shard)
        return broke

    def down(self, shard: int) -> bool:
        return shard in self._down
