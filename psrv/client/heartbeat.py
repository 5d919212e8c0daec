"""A worker's heartbeat thread: HEARTBEAT to every shard every `interval` seconds on its own
connections (zmq sockets are not thread-safe), so a worker blocked on a barrier stays in the
active set and a dead one leaves it after the servers' --worker-timeout."""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Sequence

from psrv.protocol import Message, MsgType, ProtocolError, decode, encode
from psrv.transport import create_client

log = logging.getLogger("psrv.client.psclient")
RECV_WAIT = 0.05  # seconds between looks at the stop flag where its wake-up is lost


class Heartbeat(threading.Thread):
    def __init__(self, servers: Sequence[str], *, worker: int, interval: float, session: int = 0,
                 options: dict | None = None):
        super().__init__(name=f"psrv-heartbeat-{worker}", daemon=True)
        self.servers = servers  # the client's own list: a shard it moved to another replica is beaten there too
        self.worker = worker
        self.interval = max(0.05, interval)
        self.session = session  # the PSClient's: a beat keeps alive only the process that holds the rank
        self.options = options or {}
        self._stop_event = threading.Event()
        # stop() writes a byte here, which ends the thread's wait for replies at once (each worker's close
        # waited 25 ms on average, up to RECV_WAIT, for the wait to run out)
        self._wake, self._woken = socket.socketpair()

    def signal(self) -> None:
        """Ask the thread to stop, without waiting for it (it ends at once)."""
        self._stop_event.set()
        try:
            self._wake.send(b"x")
        except OSError:  # closed: the thread has ended
            pass

    def stop(self, timeout: float = 5.0) -> None:
        self.signal()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    def run(self) -> None:
        at = list(self.servers)
        net = create_client("zmq", at, **self.options)  # sockets live in this thread
        net.wake_on(self._woken)
        answered = [True] * len(at)
        seq = 0
        try:
            while not self._stop_event.is_set():
                seq += 1
                for s in range(len(at)):
                    if self.servers[s] != at[s]:  # the client failed over to a replica (PSClient.failover)
                        at[s] = self.servers[s]
                        net.redirect(s, at[s])
                    elif not answered[s]:  # last beat went unanswered: the shard may have restarted
                        net.reconnect(s)
                    beat = Message(MsgType.HEARTBEAT, worker=self.worker, seq=seq, session=self.session)
                    net.send(s, encode(beat))
                    answered[s] = False
                until = time.monotonic() + self.interval
                while not self._stop_event.is_set() and (left := until - time.monotonic()) > 0:
                    got = net.recv(min(left, RECV_WAIT))
                    if got is None:
                        continue
                    try:
                        reply = decode(got[1])
                    except ProtocolError:
                        continue
                    if reply.seq == seq:
                        answered[got[0]] = True
        except Exception:  # the heartbeat must never take the worker down; the servers will notice
            log.exception("worker %d: heartbeat thread stopped", self.worker)
        finally:
            net.close()
            self._woken.close()
            self._wake.close()
