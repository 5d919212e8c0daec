"""The numeric levels' liveness, measured: a level that live.py's rules call live is inert all the same where
the reference's weights at every other valid level of its axis would pass this case's check (within the
matrix's tolerance, the counts equal): psrv could take the wrong level there and no check would see it.
The covering array (covering.py) stores what it measured per case in plan.json, and counts a pair only
where both its levels are live; test_matrix.py measures again (tests/conformance/evidence.py)."""
from __future__ import annotations

import torch

from tests.conformance.axes import ATOL, AXES, DEFAULT, RTOL, refusal, run_config, workers_of
from tests.conformance.live import MEASURED, inert
from tests.conformance.ref_streaming import reference_of


def reference(case: dict, workers: int):
    """The reference's run of `case` with `workers` workers (a case's own count, whichever level is tried)."""
    return reference_of(run_config(case, workers=workers), nan=case["nonfinite"] != "none").run()


def alternatives(case: dict, axis: str) -> list:
    """The other levels of `axis` that make a valid case, the default first."""
    others = dict.fromkeys(lv for lv in (DEFAULT[axis], *AXES[axis]) if lv != case[axis])
    return [lv for lv in others if not refusal({**case, axis: lv})]


def seen(want, other) -> tuple[bool, float]:
    """(would this case's check tell `other` from `want`, the largest weight gap)."""
    gap = (want.params - other.params).abs().max().item()
    told = want.counts != other.counts or not torch.allclose(other.params, want.params, atol=ATOL, rtol=RTOL)
    return told, gap


def unseen(case: dict, want=None) -> dict[str, str]:
    """axis -> why, for each measured axis at a non-default level that live.py calls live but no other level
    of which this case's check could tell apart."""
    workers, dead, out = workers_of(case), inert(case), {}
    want = want or reference(case, workers)
    for axis in MEASURED:
        if case[axis] == DEFAULT[axis] or axis in dead:
            continue
        gaps = []
        for level in alternatives(case, axis):
            told, gap = seen(want, reference({**case, axis: level}, workers))
            if told:
                break
            gaps.append(f"{level} {gap:.2g}")
        else:
            if gaps:
                out[axis] = f"below the check: the weights at {', '.join(gaps)} from these pass it"
    return out


__all__ = ["alternatives", "reference", "seen", "unseen"]
