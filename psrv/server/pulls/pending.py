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
    view: object = 0   # the number of the copy a compressed pull's worker holds (psrv/server/pulls/copies.py)
    fragment: tuple | None = None  # streaming DiLoCo: this fragment's weights only (psrv/server/fragments.py)


class PendingPulls:
    """Keyed by (worker, seq), in arrival order: adding a re-sent pull is O(1), not a scan."""

    def __init__(self) -> None:
        self._items: dict[tuple[int, int], Pending] = {}

    def __iter__(self) -> Iterator[Pending]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def add(self, peer: Hashable, *, worker: int, seq: int, clock: int, final: bool, received: float,
            push: dict | None, view: object = 0, fragment: tuple | None = None) -> None:
        p = self._items.get((worker, seq))
        if p is None:
            self._items[worker, seq] = Pending([peer], worker, seq, clock, final, received, push, view, fragment)
        elif peer not in p.peers:
            p.peers = [*p.peers[1 - MAX_PEERS:], peer]

    def holding(self, worker: int, seq) -> bool:
        return isinstance(seq, int) and (worker, seq) in self._items  # `seq` comes off the wire

    def workers(self) -> set[int]:
        return {w for w, _ in self._items}

    def drop(self, worker: int) -> None:
        self._items = {k: p for k, p in self._items.items() if p.worker != worker}

    def release(self, ready: Callable[[Pending], bool], answer: Callable[[Pending], None]) -> None:
        """Answer (and forget) every pull that is `ready` now."""
        for key, p in list(self._items.items()):
            if ready(p):
                del self._items[key]
                answer(p)

    def state_dict(self) -> list[dict]:
        """The pulls waiting, without their connections (a replica that takes them over is answered on the
        connections the workers send them on again)."""
        return [{"worker": p.worker, "seq": p.seq, "clock": p.clock, "final": p.final, "push": p.push,
                 "view": p.view, "fragment": None if p.fragment is None else [list(r) for r in p.fragment]}
                for p in self._items.values()]

    def load_state_dict(self, state: list[dict], *, received: float) -> None:
        self._items = {}
        for p in state:
            fragment = None if p["fragment"] is None else tuple(tuple(int(x) for x in r) for r in p["fragment"])
            self._items[int(p["worker"]), int(p["seq"])] = Pending(
                [], int(p["worker"]), int(p["seq"]), int(p["clock"]), bool(p["final"]), received, p["push"],
                p["view"], fragment)
