"""How many inner steps a worker takes before each push: a fixed H (local SGD, DiLoCo) or, with
`local_steps="auto:H"`, dynamic local updates (DyLU; Liu et al. 2024, "Asynchronous Local-SGD
Training for Language Modeling", sec. 4.2): the fastest worker takes H inner steps per push and
worker i takes

    H_i = max(1, floor(H * t_fastest / t_i))

where t_i is worker i's own seconds per inner step (the time between its step() calls, an
exponential moving average) and t_fastest the smallest that any active worker reported to the
servers with its last push. All workers then push at about the same rate. The first round uses H.
"""
from __future__ import annotations

import math
import re

AUTO_DEFAULT = 20  # "auto" alone: the fastest worker's inner steps per push
_AUTO = re.compile(r"auto(?::(\d+))?")


def parse_local_steps(value: int | str) -> int | str:
    """An integer H >= 1, or 'auto' / 'auto:H' (H >= 2) written as 'auto:H'; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"must be an integer >= 1, 'auto' or 'auto:H'; got {value!r}")
    if isinstance(value, int) or isinstance(value, str) and value.strip().isdigit():
        h = int(value)
        if h < 1:
            raise ValueError(f"must be >= 1; got {value!r}")
        return h
    match = _AUTO.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"must be an integer >= 1, 'auto' or 'auto:H'; got {value!r}")
    h = int(match.group(1) or AUTO_DEFAULT)
    if h < 2:
        raise ValueError(f"auto:H needs H >= 2 (the fastest worker's inner steps per push); got {value!r}")
    return f"auto:{h}"


def base_steps(value: int | str) -> int:
    """H: the fixed inner steps per push, or the fastest worker's under 'auto:H'."""
    value = parse_local_steps(value)
    return value if isinstance(value, int) else int(value.split(":")[1])


def is_dynamic(value: int | str) -> bool:
    return isinstance(parse_local_steps(value), str)


class LocalPeriod:
    """A worker's count of inner steps since its last push, and the H it pushes at."""

    def __init__(self, value: int | str, *, smoothing: float = 0.2):
        self.base = base_steps(value)
        self.dynamic = is_dynamic(value)
        self.h = self.base          # inner steps this round
        self.since_push = 0         # inner steps taken since the last push
        self.step_seconds: float | None = None  # EMA of this worker's seconds per inner step
        self.history: list[int] = []  # the inner steps of each push
        self._smoothing = smoothing
        self._last: float | None = None

    def stepped(self, now: float) -> bool:
        """An inner step ended at `now` (step() was called); True if this one pushes."""
        if self._last is not None:
            dt = now - self._last
            s = self.step_seconds
            self.step_seconds = dt if s is None else (1 - self._smoothing) * s + self._smoothing * dt
        self.since_push += 1
        return self.since_push >= self.h

    def returned(self, now: float) -> None:
        """step() is about to return: the caller's next inner step starts (its compute is timed from here)."""
        self._last = now

    def pushed(self, fastest: float | None) -> None:
        """A push of the inner steps since the last one was answered; `fastest`: the smallest seconds
        per inner step the servers know of (None: none reported), which sets the next round's H."""
        self.history.append(self.since_push)
        self.since_push = 0
        if self.dynamic and fastest is not None and self.step_seconds:
            self.h = plan_steps(self.base, fastest, self.step_seconds)

    @property
    def pending(self) -> bool:
        """Inner steps taken and not pushed yet."""
        return self.since_push > 0

    def push_fields(self) -> dict:
        """What a push tells the servers: the inner steps it covers (a quorum's merge weighs its pushes by them),
        and this worker's seconds per inner step (dynamic only)."""
        fields = {"inner_steps": self.since_push}
        if self.dynamic and self.step_seconds is not None:
            fields["step_seconds"] = float(self.step_seconds)
        return fields


def plan_steps(base: int, fastest: float, mine: float) -> int:
    """DyLU's H_i = max(1, floor(H * t_fastest / t_i)), never above H."""
    if not (mine > 0 and fastest > 0 and math.isfinite(mine) and math.isfinite(fastest)):
        return base
    return max(1, min(base, math.floor(base * fastest / mine + 1e-9)))


def fastest_of(fields: list[dict]) -> float | None:
    """The smallest `fastest_step_seconds` any shard's push reply carries (a push_pull's reply
    carries it under 'push')."""
    found = [f.get("fastest_step_seconds", f.get("push", {}).get("fastest_step_seconds")) for f in fields]
    found = [x for x in found if isinstance(x, (int, float)) and x > 0]
    return min(found) if found else None
