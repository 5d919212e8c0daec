"""StepInfo: what psrv.Worker.step() returns (psrv/client/session.py), a record of one step for the caller to log."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepInfo:
    """What one `Worker.step()` saw. `step`: steps done before this one; `clock`: the clock of the
    next push; `version`: the oldest shard version in the weights now in the model; `staleness`: the
    worst staleness of this step's push (shard version when applied - version it was computed on), 0
    where the step pushed nothing, None where its answer comes later (streaming DiLoCo's fragment push,
    answered at the next step() or at close()); `answered`: (step, staleness) of an earlier step's
    fragment push whose answer this step merged, else None; `waited`: seconds a shard held the reply back
    (sync barrier, SSP bound); `seconds`: wall time in step(), sending included."""

    step: int
    clock: int
    version: int
    staleness: int | None
    waited: float
    seconds: float
    pushed: bool = True
    answered: tuple[int, int] | None = None
