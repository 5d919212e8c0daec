"""Shards failing over in the simulator (`--shard-fail-mtbf`, `--shard-fail-down`; docs/simulator.md, "Shard
failures").

psrv's failover (docs/reliability.md, "Failover, and its bound"): a shard's primary dies, and a backup that heard
nothing from it for F/2 claims the shard and serves it from its own state, where every push the primary had
acknowledged already is. A failure loses no update; it takes the shard's thread away for the failover's time. Here
each shard's primary fails after an exponential time of mean `mtbf` simulated seconds, counted from the last
takeover, its draws its own (a generator seeded by the run's seed and the shard), and for `down` seconds after it
the shard's thread does nothing:
- what the thread was doing at the failure (a push's apply, a reply's encode) is lost, and done again once the
  backup has taken over (the worker re-sends its request to the backup, which answers it);
- what reaches the shard meanwhile waits for the takeover (the backup holds the requests until it has claimed).
A shard's failures are a sequence of the seed alone, drawn as far as the times asked about reach: the order in
which the simulator asks does not change them."""
from __future__ import annotations

import random
from bisect import bisect_left, bisect_right


class ShardFailures:
    """Each shard's failovers, a fixed sequence drawn from the seed: the first failure after an exponential time of
    mean `mtbf` from 0, each next one that long after the takeover before it, each takeover `down` after its
    failure. Drawn as far as the thread times asked about reach."""

    def __init__(self, shards: int, *, mtbf: float, down: float, seed: int):
        self.mtbf, self.down = mtbf, down
        self.draws = [random.Random(f"shard {seed} {s}") for s in range(shards)]
        self.failed: list[list[float]] = [[] for _ in range(shards)]  # each shard's failures, in order,
        self.back: list[list[float]] = [[] for _ in range(shards)]    # and the takeover after each

    def _draw(self, s: int) -> None:
        failed = (self.back[s][-1] if self.back[s] else 0.0) + self.draws[s].expovariate(1.0 / self.mtbf)
        self.failed[s].append(failed)
        self.back[s].append(failed + self.down)

    def run(self, s: int, start: float, cost: float) -> float:
        """When `cost` seconds of work that shard `s`'s thread can begin at `start` end, past every failover it
        meets: a failover under way when the work would begin holds it until the takeover, and a failure before
        the work ends has it done again after the takeover."""
        failed, back = self.failed[s], self.back[s]
        i = bisect_right(failed, start) - 1  # the last failure at or before the start
        if i >= 0 and start < back[i]:
            start = back[i]
        i += 1
        while True:
            if i == len(failed):
                self._draw(s)
            if start + cost <= failed[i]:
                return start + cost
            if start < back[i]:
                start = back[i]
            i += 1

    def until(self, end: float) -> int:
        """Every shard's failures before `end` (the run's last step), whether or not its thread was busy then."""
        count = 0
        for s in range(len(self.failed)):
            while not self.failed[s] or self.failed[s][-1] < end:
                self._draw(s)
            count += bisect_left(self.failed[s], end)
        return count
