"""The winner sentence names a winner only when the lead is larger than the spread of the repeats."""
from __future__ import annotations

import statistics

from psrv.experiments.harness.collect import METRICS, Stat, VariantSummary
from psrv.experiments.harness.winner import clear_lead, winner_lines

TARGET = "eval_loss <= 0.2"


def _variant(name: str, times: list[float | None]) -> VariantSummary:
    """A variant whose repeats reached the target at these wall times (None: that repeat did not)."""
    reached = [t for t in times if t is not None]
    stats = {m: Stat(None, None) for m in METRICS}
    if len(reached) == len(times):
        stats["time_to_target_seconds"] = Stat.of(reached)
    return VariantSummary(variant=name, mode="sync", staleness=None, repeats=len(times),
                          target_reached=len(reached), stats=stats)


def _sentence(*variants: VariantSummary) -> str:
    [line] = winner_lines(list(variants), TARGET)
    return line


def test_a_lead_larger_than_the_spread_names_the_winner() -> None:
    fast, slow = [1.0, 1.2, 1.1], [2.0, 2.3, 2.1]  # means 1.1 and 2.133, stds 0.1 and 0.153
    gap = statistics.fmean(slow) - statistics.fmean(fast)
    assert gap > statistics.stdev(fast) + statistics.stdev(slow)
    line = _sentence(_variant("slow", slow), _variant("fast", fast))
    assert line.startswith("`fast` wins: `fast` reached the target (eval_loss <= 0.2) first in wall time: 1.1 s ± 0.1")
    assert "ahead of the runner-up `slow` (2.13 s ± 0.15) by 1.03 s" in line
    assert "No clear winner" not in line


def test_a_lead_within_the_spread_names_no_winner() -> None:
    a, b = [1.0, 2.0, 3.0], [1.5, 2.5, 3.5]  # means 2.0 and 2.5, both std 1.0: the gap 0.5 < 2.0
    line = _sentence(_variant("a", a), _variant("b", b))
    assert line.startswith("No clear winner: `a` reached the target")
    assert "ahead of `b` (2.5 s ± 1) by 0.5 s, which is within their spread (2 s" in line
    assert "wins" not in line


def test_one_repeat_has_no_spread_so_no_winner() -> None:
    line = _sentence(_variant("a", [1.0]), _variant("b", [9.0]))
    assert line.startswith("No clear winner:") and "single repeat has no spread" in line


def test_the_only_variant_that_reached_the_target_every_time_wins() -> None:
    line = _sentence(_variant("a", [1.0, 1.5, 1.2]), _variant("b", [0.5, None, 0.6]))
    assert line.startswith("`a` wins:") and "the only variant that reached it in every repeat" in line
    assert "`b` (2/3 repeats)" in line


def test_clear_lead_is_the_non_overlap_of_mean_plus_minus_std() -> None:
    assert clear_lead(Stat(1.0, 0.2), Stat(2.0, 0.7))        # 1.0 > 0.9
    assert not clear_lead(Stat(1.0, 0.5), Stat(2.0, 0.5))    # 1.0 is not > 1.0
    assert not clear_lead(Stat(1.0, None), Stat(5.0, 0.1))   # one repeat: unknown spread
    assert not clear_lead(Stat(1.0, 0.1), Stat(None, None))
