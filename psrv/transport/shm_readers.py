"""Who is still reading the shard's weights in place: a counter per worker, in a memfd both map.

The shard counts the answers it sent each worker by place (`sent`); the worker writes into its own
8-byte counter how many of those it has finished reading. Before the shard writes its weights it
waits until every worker has caught up (`wait`), as the zmq transport waits for its zero-copy sends to
leave. A worker that does not catch up within `timeout` (it died, or an answer to a re-sent request
sits unread in its queue) is given up on: the sequence lock then drops whatever it reads late.
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from typing import Hashable

log = logging.getLogger("psrv.transport")
MAX_READERS = 4096
COUNT = struct.Struct("<Q")


class Readers:
    def __init__(self, *, timeout: float = 1.0):
        self.timeout = timeout
        self._fd = os.memfd_create("psrv-readers", os.MFD_CLOEXEC)
        self.size = MAX_READERS * COUNT.size
        os.ftruncate(self._fd, self.size)
        self._map = mmap.mmap(self._fd, self.size)
        self._index: dict[Hashable, int] = {}
        self._sent: dict[Hashable, int] = {}
        self._free = list(range(MAX_READERS - 1, -1, -1))

    def join(self, peer: Hashable) -> dict:
        """A counter for `peer` (its part of the shm answer); {} when all are taken (it reads copies)."""
        self.leave(peer)
        if not self._free:
            return {}
        i = self._index[peer] = self._free.pop()
        self._sent[peer] = 0
        COUNT.pack_into(self._map, i * COUNT.size, 0)
        return {"readers_fd": self._fd, "readers_size": self.size, "index": i}

    def counts(self, peer: Hashable) -> bool:
        return peer in self._index

    def sent(self, peer: Hashable) -> None:
        self._sent[peer] += 1

    def _done(self, peer: Hashable) -> int:
        return COUNT.unpack_from(self._map, self._index[peer] * COUNT.size)[0]

    def wait(self) -> None:
        behind = [p for p, n in self._sent.items() if self._done(p) < n]
        deadline = time.monotonic() + self.timeout
        while behind:
            behind = [p for p in behind if self._done(p) < self._sent[p]]
            if behind and time.monotonic() > deadline:
                log.debug("shared memory: %d worker(s) still reading after %.1fs; writing anyway", len(behind),
                          self.timeout)
                for p in behind:
                    self._sent[p] = self._done(p)
                return
            time.sleep(0.0001 if behind else 0)

    def leave(self, peer: Hashable) -> None:
        i = self._index.pop(peer, None)
        self._sent.pop(peer, None)
        if i is not None:
            self._free.append(i)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
