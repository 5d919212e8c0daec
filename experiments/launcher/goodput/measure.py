"""The arithmetic of goodput (docs/reliability.md, "Goodput"): a run's useful samples per second over its span,
and what each fault cost: the time its window took beyond what the baseline's rate needed for the samples made
in it. Pure functions of a run's steps (experiments/launcher/goodput/steps.py) and its faults."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from psrv.experiments.launcher.goodput.steps import RunSteps


@dataclass(frozen=True)
class Measured:
    """A run's useful samples per second. `start`: its first push; `end`: the first leave or finish of a rank in
    a shard's final lineage (the first rank done: until then every rank had steps to do), or the last useful
    step where no rank left; `rate`: useful samples completed in [start, end] per second of it. `last`: the
    last useful step, `whole_rate`: every useful sample per second of [start, last] (end to end: with the tail in
    which the ranks that fell behind finish alone). `done`: each useful step's time, sorted."""
    start: float
    end: float
    last: float
    per_step: int
    done: list[float]

    @property
    def span_s(self) -> float:
        return self.end - self.start

    def samples(self, a: float, b: float) -> int:
        """Useful samples whose step completed in [a, b) (b == end: up to and including it)."""
        hi = bisect.bisect_right(self.done, b) if b >= self.end else bisect.bisect_left(self.done, b)
        return (hi - bisect.bisect_left(self.done, a)) * self.per_step

    @property
    def rate(self) -> float | None:
        return self.samples(self.start, self.end) / self.span_s if self.span_s > 0 else None

    @property
    def whole_rate(self) -> float | None:
        return len(self.done) * self.per_step / (self.last - self.start) if self.last > self.start else None


def measure(run: RunSteps, per_step: int) -> Measured | None:
    """`run`'s Measured, `per_step` samples to a step; None where no step was useful."""
    done = sorted(s.done_t for s in run.steps.values() if s.useful and s.done_t is not None)
    if run.started is None or not done:
        return None
    last = done[-1]
    ends = [t for t in run.finished.values() if t > run.started]
    return Measured(run.started, min(ends) if ends else last, last, per_step, done)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fault_costs(m: Measured, faults: list[dict], base_rate: float | None) -> tuple[list[dict], float | None]:
    """Each fault done (its `t` on the histories' clock) with the window it owns, from its time to the next fault's
    (or the span's end), the useful samples completed in it, and its cost: the window's length less the seconds
    the baseline's rate takes for those samples. The window before the first fault has a cost too (returned
    second); with it, the costs add up to span - useful samples / baseline rate. A fault before the span's start
    owns its window from the start; one after the span's end owns none (cost None). No baseline: costs None."""
    ordered = sorted(faults, key=lambda f: f["t"])
    inside = [f for f in ordered if f["t"] < m.end]
    cuts = [max(m.start, f["t"]) for f in inside] + [m.end]
    rows = []
    for f, a, b in zip(inside, cuts, cuts[1:]):
        made = m.samples(a, b)
        rows.append({"id": f["id"], "kind": f["kind"], "target": f["target"], "at_s": round(f["t"] - m.start, 3),
                     "window_s": round(b - a, 3), "samples": made,
                     "cost_s": None if not base_rate else round(b - a - made / base_rate, 3)})
    rows += [{"id": f["id"], "kind": f["kind"], "target": f["target"], "at_s": round(f["t"] - m.start, 3),
              "window_s": 0.0, "samples": 0, "cost_s": None} for f in ordered[len(inside):]]
    first = cuts[0]
    before = None if not base_rate else round(first - m.start - m.samples(m.start, first) / base_rate, 3)
    return rows, before


def role(target: str) -> str:
    """'primary' of 'primary:1', 'worker/primary' of a partition's 'worker:2/primary:0', 'disk' of ''."""
    return "/".join(t.split(":")[0] for t in target.split("/")) if target else "disk"


def by(rows: list[dict], key) -> dict[str, dict]:
    """Faults grouped by key(row): how many, how many have a cost (not after the span, a baseline given), and
    those costs' total and mean."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    out = {}
    for name, group in sorted(groups.items()):
        costs = [r["cost_s"] for r in group if r["cost_s"] is not None]
        out[name] = {"faults": len(group), "costed": len(costs), "cost_s": round(sum(costs), 3) if costs else None,
                     "mean_s": round(sum(costs) / len(costs), 3) if costs else None}
    return out
