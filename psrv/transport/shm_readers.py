"""Who is still reading the shard's weights in place: a counter per worker, in a memfd both map.

The shard numbers the answers it sends each worker by place (`sent`: 1, 2, ...; the number travels in
the answer's descriptor); the worker writes into its own 8-byte counter the number of the last one it
has finished with (read, or dropped as torn). Before the shard writes its weights it waits until every
worker has finished with the last answer it was sent (`wait`), as the zmq transport waits for its
zero-copy sends to leave. A worker that does not within `timeout` (it died, or an answer to a re-sent
request sits unread in its queue) is given up on for the answers sent so far, and only those: the
sequence lock then drops whatever of them it reads late, and the next answer it is sent is waited for
again (its counter says which answer it finished with, not how many, so a late read never counts for a
later answer).
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
        self._sent: dict[Hashable, int] = {}  # the number of the last answer sent by place
        self._waived: dict[Hashable, int] = {}  # answers up to this one are no longer waited for
        self._free = list(range(MAX_READERS - 1, -1, -1))
        self.given_up = 0  # answers the shard stopped waiting for (their reader slower than `timeout`, or gone)

    def join(self, peer: Hashable) -> dict:
        """A counter for `peer` (its part of the shm answer); {} when all are taken (it reads copies)."""
        self.leave(peer)
        if not self._free:
            return {}
        i = self._index[peer] = self._free.pop()
        self._sent[peer] = self._waived[peer] = 0
        COUNT.pack_into(self._map, i * COUNT.size, 0)
        return {"readers_fd": self._fd, "readers_size": self.size, "readers_ino": os.fstat(self._fd).st_ino,
                "index": i}

    def counts(self, peer: Hashable) -> bool:
        return peer in self._index

    def sent(self, peer: Hashable) -> int:
        """Count one more answer to `peer` by place; its number (for the descriptor)."""
        self._sent[peer] += 1
        return self._sent[peer]

    def _done(self, peer: Hashable) -> int:
        return COUNT.unpack_from(self._map, self._index[peer] * COUNT.size)[0]

    def wait(self) -> None:
        behind = [p for p, n in self._sent.items() if n > self._waived[p] and self._done(p) < n]
        deadline = time.monotonic() + self.timeout
        while behind:
            behind = [p for p in behind if self._done(p) < self._sent[p]]
            if behind and time.monotonic() > deadline:
                log.debug("shared memory: %d worker(s) still reading after %.1fs; writing anyway", len(behind),
                          self.timeout)
                for p in behind:
                    self.given_up += self._sent[p] - max(self._waived[p], self._done(p))
                    self._waived[p] = self._sent[p]
                return
            time.sleep(0.0001 if behind else 0)

    def leave(self, peer: Hashable) -> None:
        i = self._index.pop(peer, None)
        self._sent.pop(peer, None)
        self._waived.pop(peer, None)
        if i is not None:
            self._free.append(i)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
