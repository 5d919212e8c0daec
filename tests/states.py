"""Comparing the state of two shards: a backup's state_dict against its primary's, leaf by leaf, tensors bit
for bit (weights, optimizer state, clocks, the exactly-once table). Used by the replication tests and the
conformance matrix's `replicas` axis."""
from __future__ import annotations

import torch


def assert_same_state(a, b, path: str = "state") -> None:
    """Every leaf of two state dicts equal, tensors bit for bit; the AssertionError names the first leaf
    that differs."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), \
            f"{path}: keys {sorted(a, key=str)} != {sorted(b, key=str) if isinstance(b, dict) else b!r}"
        for k in a:
            assert_same_state(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
