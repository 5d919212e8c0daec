"""What every controller shares: the active set and each worker's clock (steps pushed)."""
from __future__ import annotations

import enum
from collections import Counter


class Decision(enum.Enum):
    APPLY = "apply"            # apply this gradient now
    ACCUMULATE = "accumulate"  # add it to the open clock's sum
    DROP = "drop"              # a late gradient of a finished clock


class Controller:
    mode = "base"
    skipped = 0  # clocks lost to a restore: only sync's barrier can skip clocks (see catch_up)

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self.active: set[int] = set(range(num_workers))
        self.clocks: dict[int, int] = {w: 0 for w in range(num_workers)}
        self.finishing: set[int] = set()  # active, done pushing, awaiting their final pull
        self._recount()

    def _recount(self) -> None:
        """The slowest active clock, kept up to date per push instead of a scan over every worker
        per answered pull: `_at` counts active workers at each clock."""
        self._at = Counter(self.clocks.get(w, 0) for w in self.active)
        self._min = min(self._at, default=0)

    # --- membership -------------------------------------------------------
    def leave(self, worker: int) -> None:
        """`worker` leaves the active set: its clock leaves the count (in constant time: a run's N workers
        leaving at its end would otherwise cost N scans of N clocks on every shard)."""
        if worker in self.active:
            self.active.discard(worker)
            self._uncount(self.clocks.get(worker, 0))
        self.finishing.discard(worker)

    def join(self, worker: int) -> None:
        self.finishing.discard(worker)
        clock = self.clocks.setdefault(worker, 0)
        if worker not in self.active:
            self.active.add(worker)
            self._min = clock if not self._at or clock < self._min else self._min
            self._at[clock] += 1

    def _uncount(self, clock: int) -> None:
        """One active worker at `clock` fewer."""
        self._at[clock] -= 1
        if not self._at[clock]:
            del self._at[clock]
            if clock == self._min:
                self._min = min(self._at, default=0)

    def expect(self, worker: int, clock: int) -> None:
        """`worker` pulls the weights for `clock`, the next it pushes (sync: where a joiner starts to count)."""

    def finish(self, worker: int) -> None:
        """`worker` pushes no more (its final pull came): barriers stop counting on it."""
        if worker in self.active:
            self.finishing.add(worker)

    def counted_from(self, worker: int) -> int | None:
        """The first clock whose barrier waits for a worker that (re)joined, where that is later than now; None."""
        return None

    def pushing(self) -> set[int]:
        """The workers a barrier waits for: active and not finished."""
        return self.active - self.finishing

    def pushing_count(self) -> int:
        """len(pushing()) without building the set (a barrier's test per push would cost a scan of every
        worker): `finishing` holds active workers only (finish adds an active one, leave drops it from both,
        a load keeps the active ones)."""
        return len(self.active) - len(self.finishing)

    def min_clock(self) -> int:
        return self._min

    def clock_gap(self, clock: int) -> int:
        """How far `clock` (a worker being answered) runs ahead of the slowest active worker."""
        return max(0, clock - self.min_clock()) if self.active else 0

    # --- the policy -------------------------------------------------------
    def push(self, worker: int, clock: int, age: int = 0, part: int | None = None) -> Decision:
        """Record a push of `worker`'s gradient for `clock`, computed on weights `age` updates old, and say what
        to do with it; `part`: the fragment it carries, where a quorum merges per part (select)."""
        self.select(part)
        old = self.clocks.get(worker, 0)
        new = self.clocks[worker] = max(old, clock + 1)
        if new != old and worker in self.active:
            self._at[new] += 1
            self._uncount(old)
        return self._decide(worker, clock, age)

    def _decide(self, worker: int, clock: int, age: int) -> Decision:
        raise NotImplementedError

    def select(self, part: int | None) -> None:
        """Look at `part`'s open merge (a quorum's merges are per fragment); the other modes have one clock."""

    def parts(self) -> list[int | None]:
        """The parts with an open clock or merge (QuorumController: one per fragment)."""
        return [None]

    def void(self, worker: int) -> None:
        """`worker`'s push just recorded carries no gradient (dropped as non-finite): sync leaves it out
        of the clock's quorum; the other modes have none."""

    def commit_ready(self) -> bool:
        """True when buffered gradients should be applied now (sync only)."""
        return False

    def committed(self) -> None:
        """The shard applied the buffered gradients."""

    def pull_ready(self, worker: int, clock: int) -> bool:
        """May a pull by `worker` at `clock` be answered now?"""
        raise NotImplementedError

    def next_clock(self, worker: int) -> int:
        """The clock `worker` should push next (sync hands a late joiner the open clock)."""
        return self.clocks.get(worker, 0)

    def catch_up(self, clock: int) -> int:
        """A push for `clock` reached a shard restored from an older checkpoint; returns the
        clocks skipped (sync: the open clock jumps to `clock`, its buffered sum is void)."""
        return 0

    # --- checkpoints ------------------------------------------------------
    def state_dict(self) -> dict:
        return {"mode": self.mode, "active": sorted(self.active),
                "clocks": {int(w): int(c) for w, c in self.clocks.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("mode") != self.mode:
            raise ValueError(f"checkpoint holds a {state.get('mode')!r} controller, this server runs {self.mode!r}")
        self.active = {int(w) for w in state["active"]}
        self.clocks = {int(w): int(c) for w, c in state["clocks"].items()}
        self.finishing &= self.active
        self._recount()
