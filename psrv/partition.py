"""Partition plan: named parameters laid out in one flat fp32 vector, cut into byte-balanced shards.

A large tensor may span shards (MXNet's big-array split). The plan is a pure function of
(names, shapes, dtypes, num_shards) and its hash is checked at HELLO.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import torch


LAYOUT_LIMIT, LAYOUT_NAME_CHARS = 512, 16384  # the most tensors, and characters of their names, HELLO describes


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class PartitionPlan:
    params: tuple[ParamSpec, ...]
    num_shards: int

    def __post_init__(self) -> None:
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")
        if self.total < self.num_shards:
            raise ValueError(f"{self.total} parameters cannot fill {self.num_shards} shards")
        if any(p.dtype != "float32" for p in self.params):
            raise ValueError("psrv keeps parameters as float32; cast the model with .float()")

    @classmethod
    def from_module(cls, module: torch.nn.Module, num_shards: int) -> "PartitionPlan":
        specs = tuple(ParamSpec(n, tuple(p.shape), str(p.dtype).removeprefix("torch."))
                      for n, p in module.named_parameters())
        return cls(specs, num_shards)

    @property
    def total(self) -> int:
        """Number of fp32 elements in the flat vector."""
        return sum(p.numel for p in self.params)

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """[start, end) element ranges of the flat vector, one per shard, sizes differing by <= 1."""
        return tuple(shard_range(self.total, self.num_shards, i) for i in range(self.num_shards))

    def pieces(self, shard: int) -> list[tuple[str, int, int]]:
        """(param name, start, end) element slices of each parameter that lies in `shard`."""
        lo, hi = self.ranges[shard]
        out, offset = [], 0
        for p in self.params:
            a, b = max(lo, offset), min(hi, offset + p.numel)
            if a < b:
                out.append((p.name, a - offset, b - offset))
            offset += p.numel
        return out

    def layout(self) -> list[list] | None:
        """[[name, [dims...]], ...] in plan order, which a HELLO carries so that a shard refusing another model
        can say which parameter differs; None for a model past LAYOUT_LIMIT tensors or LAYOUT_NAME_CHARS of
        names (a HELLO's header stays far below the protocol's 64 KiB; the refusal then names the counts)."""
        if len(self.params) > LAYOUT_LIMIT or sum(len(p.name) for p in self.params) > LAYOUT_NAME_CHARS:
            return None
        return [[p.name, list(p.shape)] for p in self.params]

    @property
    def hash(self) -> str:
        """Hex digest identifying the model layout and the sharding."""
        doc = json.dumps({"params": [[p.name, list(p.shape), p.dtype] for p in self.params],
                          "num_shards": self.num_shards}, separators=(",", ":"))
        return hashlib.sha256(doc.encode()).hexdigest()[:16]


def shard_range(total: int, num_shards: int, shard: int) -> tuple[int, int]:
    """[start, end) of `shard` when `total` fp32 elements are cut into byte-balanced ranges."""
    base, extra = divmod(total, num_shards)
    start = shard * base + min(shard, extra)
    return start, start + base + (1 if shard < extra else 0)
