"""The report's winner sentence: which variant reached the target first in wall time, named only when
its lead over the runner-up is larger than the spread of the repeats.

The rule: with means m1 < m2 and sample standard deviations s1, s2 over repeats, the first is a clear
winner when m2 - m1 > s1 + s2 (the mean ± std intervals do not overlap). One repeat has no spread, so it
never names a winner. A variant that reached the target in every repeat beats one that did not; a repeat
that diverged (its held-out loss NaN or Inf) never reached it (experiments/harness/collect.py).
"""
from __future__ import annotations

from psrv.experiments.harness.collect import Stat, VariantSummary


def clear_lead(best: Stat, other: Stat) -> bool:
    """Whether `best` (the lower mean) is ahead of `other` by more than the sum of their stds."""
    if best.mean is None or other.mean is None or best.std is None or other.std is None:
        return False
    return other.mean - best.mean > best.std + other.std


def _ttt(s: VariantSummary) -> Stat:
    return s.stats["time_to_target_seconds"]


def _shown(stat: Stat) -> str:
    return f"{stat.mean:.3g} s" + (f" ± {stat.std:.2g}" if stat.std is not None else "")


def winner_lines(summaries: list[VariantSummary], target: str) -> list[str]:
    """One paragraph: the winner (or that there is none), the order, and who missed the target."""
    reached = sorted((s for s in summaries if _ttt(s).mean is not None), key=lambda s: _ttt(s).mean)
    missed = [f"`{s.variant}` ({s.target_reached}/{s.repeats} repeats{f', {s.diverged} diverged' if s.diverged else ''})"
              for s in summaries if _ttt(s).mean is None and s.repeats]
    empty = [f"`{s.variant}`" for s in summaries if not s.repeats]
    tail = [f"No finished runs: {', '.join(empty)}."] if empty else []
    if not reached:
        return [" ".join([f"No variant reached the target ({target}) in every repeat.", *tail])]
    best = reached[0]
    lines = [_verdict(best, reached[1] if len(reached) > 1 else None, target, others=bool(missed))]
    if len(reached) > 1:
        lines.append("Order (mean ± std over repeats): "
                     + ", ".join(f"`{s.variant}` {_shown(_ttt(s))}" for s in reached) + ".")
    if missed:
        lines.append("Did not reach it in every repeat: " + ", ".join(missed) + ".")
    return [" ".join(lines + tail)]


def _verdict(best: VariantSummary, second: VariantSummary | None, target: str, *, others: bool) -> str:
    stat = _ttt(best)
    first = (f"`{best.variant}` reached the target ({target}) first in wall time: {_shown(stat)} "
             f"(mean ± std over {best.repeats} repeat(s)")
    if stat.std is None:
        return (f"No clear winner: {first}), but a single repeat has no spread to compare a difference "
                "with; repeat each variant with at least 3 seeds.")
    if second is None:
        why = "the only variant that reached it in every repeat" if others else "the only variant"
        return f"`{best.variant}` wins: {first}), {why}."
    other = _ttt(second)
    if other.std is None:
        return (f"No clear winner: {first}), and the runner-up `{second.variant}` ({_shown(other)}) has a "
                "single repeat, so no spread to compare the difference with.")
    gap, spread = other.mean - stat.mean, stat.std + (other.std or 0.0)
    if clear_lead(stat, other):
        return (f"`{best.variant}` wins: {first}), ahead of the runner-up `{second.variant}` "
                f"({_shown(other)}) by {gap:.3g} s, more than their spread ({spread:.2g} s, the sum of the stds).")
    return (f"No clear winner: {first}) is ahead of `{second.variant}` ({_shown(other)}) by {gap:.3g} s, "
            f"which is within their spread ({spread:.2g} s, the sum of the stds).")
