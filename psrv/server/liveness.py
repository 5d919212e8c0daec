"""Worker liveness: who was heard from when, who left, who was lost to silence (and may rejoin)."""
from __future__ import annotations

from typing import Callable, Iterable


class Liveness:
    """Bookkeeping only; the service decides what leaving the active set means.

    A worker that sends heartbeats is judged by silence alone. One that never did (a client
    without a heartbeat thread) is also kept while it has a request waiting on the shard.
    """

    STALL = 0.5  # a gap this long between two looks means the shard itself was busy

    def __init__(self, *, timeout: float, join_timeout: float, now: Callable[[], float]):
        self.timeout = timeout
        self.join_timeout = join_timeout
        self.now = now
        self.started = self._last_look = now()
        self.last_seen: dict[int, float] = {}
        self.heartbeats: set[int] = set()
        self.left: set[int] = set()   # sent LEAVE
        self.lost: set[int] = set()   # removed for silence; HELLO brings them back

    def seen(self, worker: int, *, heartbeat: bool = False) -> None:
        self.last_seen[worker] = self.now()
        if heartbeat:
            self.heartbeats.add(worker)

    def silent(self, worker: int) -> float:
        return self.now() - self.last_seen.get(worker, self.started)

    def look(self) -> None:
        """Called every turn of the loop. While the shard was busy (a slow first HELLO, a long
        checkpoint, a starved CPU) it heard nobody: that time does not count as anyone's silence."""
        now = self.now()
        gap, self._last_look = now - self._last_look, now
        if gap > self.STALL:
            self.started += gap
            for w in self.last_seen:
                self.last_seen[w] += gap

    def expired(self, active: Iterable[int], waiting: set[int]) -> list[int]:
        """Active workers silent for longer than allowed (join_timeout if never heard from)."""
        out = []
        for w in sorted(active):
            if w in waiting and w not in self.heartbeats:
                continue
            limit = self.timeout if w in self.last_seen else self.join_timeout
            if self.silent(w) > limit:
                out.append(w)
        return out

    def unheard(self, active: Iterable[int]) -> list[int]:
        """Active workers never heard from: not joined yet (no HELLO since the shard started)."""
        return sorted(w for w in active if w not in self.last_seen)

    def waited(self) -> float:
        """Seconds since the shard started, less the time it was busy: how long the unheard have had to join."""
        return self.now() - self.started

    def rejoined(self, worker: int) -> None:
        self.left.discard(worker)
        self.lost.discard(worker)

    def restart_clocks(self, workers: Iterable[int]) -> None:
        """After a restore: every active worker gets a full timeout to find the shard again."""
        for w in workers:
            self.last_seen[w] = self.now()

    def state_dict(self) -> dict:
        return {"left": sorted(self.left), "lost": sorted(self.lost)}

    def load_state_dict(self, state: dict) -> None:
        self.left = {int(w) for w in state["left"]}
        self.lost = {int(w) for w in state["lost"]}
