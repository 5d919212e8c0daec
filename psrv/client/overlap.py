"""Overlap communication with backward: each shard's gradient goes out as soon as it is final.

Backward produces gradients from the last layer to the first. A shard owns a contiguous range of
the flat gradient, so the last shard's range is often complete while backward still works on the
first layers. `ShardReadiness` counts, per shard, the parameters overlapping its range that still
wait for their gradient (autograd's post-accumulate-grad hooks), and calls back when one reaches
zero. This is DDP's bucketing and BytePS's priority order, with the shards as buckets.
`repeated` says that a second backward ran while armed (its gradient came after the early sends).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


class ShardReadiness:
    def __init__(self, model: torch.nn.Module, ranges: Sequence[tuple[int, int]]):
        self._shards_of: list[list[int]] = []
        self._needs = [0] * len(ranges)
        offset = 0
        for i, p in enumerate(model.parameters()):  # the flat order, as FlatModel and the plan lay it out
            lo, hi = offset, offset + p.numel()
            offset = hi
            shards = [s for s, (a, b) in enumerate(ranges) if a < hi and lo < b]
            self._shards_of.append(shards)
            if p.requires_grad:
                for s in shards:
                    self._needs[s] += 1
                p.register_post_accumulate_grad_hook(lambda _p, i=i: self._done(i))
        self._left: list[int] = []
        self._callback: Callable[[int], None] | None = None
        self.repeated = False

    def arm(self, callback: Callable[[int], None]) -> None:
        """Call `callback(shard)` during the next backward as each shard's gradient becomes final."""
        self._left = list(self._needs)
        self._callback = callback
        self.repeated = False

    def disarm(self) -> None:
        self._callback = None

    def _done(self, i: int) -> None:
        if self._callback is None:
            return
        for s in self._shards_of[i]:
            self._left[s] -= 1
            if self._left[s] == 0:
                self._callback(s)
            elif self._left[s] < 0:
                self.repeated = True
