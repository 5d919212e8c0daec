"""Deferred replies: pulls the consistency controller does not allow yet, answered later.

A client may re-send a pull it got no answer to, maybe on a new connection: the copies are
one request (same worker and seq), answered once on each connection it came on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterator

MAX_PEERS = 4


@dataclass
class Pending:
    peers: list[Hashable]
    worker: int
    seq: int
    clock: int
    final: bool      # rank 0's last pull: also waits until every other worker has left
    received: float
    push: dict | None  # the push half of a PUSH_PULL, for the reply


class PendingPulls:
    def __init__(self) -> None:
        self._items: list[Pending] = []

    def __iter__(self) -> Iterator[Pending]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, peer: Hashable, *, worker: int, seq: int, clock: int, final: bool, received: float,
            push: dict | None) -> None:
        for p in self._items:
            if p.worker == worker and p.seq == seq:
                if peer not in p.peers:
                    p.peers = [*p.peers[1 - MAX_PEERS:], peer]
                return
        self._items.append(Pending([peer], worker, seq, clock, final, received, push))

    def holding(self, worker: int, seq) -> bool:
        return any(p.worker == worker and p.seq == seq for p in self._items)

    def workers(self) -> set[int]:
        return {p.worker for p in self._items}

    def drop(self, worker: int) -> None:
        self._items = [p for p in self._items if p.worker != worker]

    def release(self, ready: Callable[[Pending], bool], answer: Callable[[Pending], None]) -> None:
        """Answer (and forget) every pull that is `ready` now."""
        still = []
        for p in self._items:
            if ready(p):
                answer(p)
            else:
                still.append(p)
        self._items = still
