"""Streaming DiLoCo's fragments of a model (Douillard et al. 2025, arXiv:2501.18512): which elements of the
flat parameter vector each of F fragments holds, and where they fall in each shard.

Strided by tensor: fragment f holds the parameter tensors f, f+F, f+2F, ... in the model's parameter order
(PartitionPlan's), each whole. Per tensor, not per fixed-size block of elements, because the paper's
fragments are sets of layers strided through the depth (so each fragment has early and late layers, and one
sync moves a slice of every depth), and a model's tensors in order are its layers in order; a tensor kept whole
also keeps its elements under one outer step, as a layer is in the paper. A fixed-size block would cut
tensors and mix unrelated ones. So F is at most the number of parameter tensors, and the fragments are as
even as the tensors' sizes allow (a model with one huge tensor has one huge fragment).

A fragment is a sorted list of global [start, stop) ranges of the flat vector; `shard_ranges(f)` gives, per
shard, the shard-relative ranges of its pieces there (the push's `fragment` field, psrv/server/fragments.py),
and `gather`/`scatter` move a fragment between the flat vector and one contiguous buffer, whose shard s part
is `bounds[f][s]` (the ranges are sorted and shards are contiguous, so each shard's pieces are consecutive).
"""
from __future__ import annotations

import torch

from psrv.partition import PartitionPlan

Ranges = list[tuple[int, int]]


class Fragments:
    def __init__(self, plan: PartitionPlan, count: int):
        tensors = len(plan.params)
        if not 1 <= count <= tensors:
            raise ValueError(f"fragments must be in 1..{tensors} (this model's parameter tensors, each whole in "
                             f"one fragment); got {count}")
        self.count, self.plan = count, plan
        starts, offset = [], 0
        for p in plan.params:
            starts.append((offset, offset + p.numel))
            offset += p.numel
        self.ranges: list[Ranges] = [_merged(starts[f::count]) for f in range(count)]
        self.numel = [sum(b - a for a, b in r) for r in self.ranges]
        self._shard: list[list[Ranges]] = [[_clip(r, lo, hi) for lo, hi in plan.ranges] for r in self.ranges]
        self.bounds: list[list[tuple[int, int]]] = []
        for per_shard in self._shard:
            at, bounds = 0, []
            for pieces in per_shard:
                n = sum(b - a for a, b in pieces)
                bounds.append((at, at + n))
                at += n
            self.bounds.append(bounds)

    def shard_ranges(self, f: int, shard: int) -> list[list[int]]:
        """Fragment f's pieces in `shard`, shard-relative [start, stop) (a push's `fragment` field)."""
        lo = self.plan.ranges[shard][0]
        return [[a - lo, b - lo] for a, b in self._shard[f][shard]]

    def pieces(self, f: int, shard: int) -> Ranges:
        """Fragment f's pieces in `shard`, as global [start, stop) ranges of the flat vector."""
        return list(self._shard[f][shard])

    def gather(self, f: int, flat: torch.Tensor) -> torch.Tensor:
        """Fragment f's elements of `flat`, in order, as one new tensor."""
        return torch.cat([flat[a:b] for a, b in self.ranges[f]])

    def scatter(self, f: int, values: torch.Tensor, flat: torch.Tensor) -> None:
        """flat's fragment f elements <- `values` (gather's layout)."""
        at = 0
        for a, b in self.ranges[f]:
            flat[a:b].copy_(values[at:at + b - a])
            at += b - a


def _merged(ranges: Ranges) -> Ranges:
    """Adjacent ranges joined (with F = 1 the whole vector is one range)."""
    out: Ranges = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _clip(ranges: Ranges, lo: int, hi: int) -> Ranges:
    return [(max(a, lo), min(b, hi)) for a, b in ranges if a < hi and b > lo]
