"""The report plots' arithmetic, against the same numbers counted by hand: samples seen and updates
applied at an evaluation, the clock gap at each step, and which modes (and sync's quorum) get a staleness panel."""
from __future__ import annotations

from psrv.experiments.harness.plots.figure import VariantData, has_staleness
from psrv.experiments.harness.plots.progress import Progress
from psrv.experiments.harness.plots.staleness import clock_gaps


def _rows(steps: list[tuple[float, int, int]]) -> list[dict[str, str]]:
    """(wall_time, worker, step) -> steps.csv rows of batch 32, repeat 0."""
    return [{"repeat": "0", "wall_time": str(t), "worker": str(w), "step": str(s), "batch_size": "32"}
            for t, w, s in steps]


def test_samples_and_updates_at_a_time_are_counted_from_the_step_log() -> None:
    # async, 2 workers, 3 steps each: 6 pushes, 6 updates; worker 1 is slower
    rows = _rows([(0.1, 0, 0), (0.2, 0, 1), (0.25, 1, 0), (0.3, 0, 2), (0.5, 1, 1), (0.7, 1, 2)])
    prog = Progress(rows, updates=6)
    for t in (0.0, 0.1, 0.26, 0.3, 0.69, 1.0):
        done = [r for r in rows if float(r["wall_time"]) <= t]  # by hand
        assert prog.at(t) == {"samples": 32.0 * len(done), "updates": float(len(done)), "wall_time": t}
    # sync, 2 workers: 6 pushes made 3 updates; after both workers' second step, 2 updates
    assert Progress(rows, updates=3).at(0.5)["updates"] == 2.5  # 5 of 6 pushes: between two updates
    assert Progress(rows, updates=3).at(0.7)["updates"] == 3.0


def test_the_clock_gap_is_a_workers_clock_minus_the_slowest_when_it_finished_a_step() -> None:
    rows = _rows([(0.1, 0, 0), (0.2, 0, 1), (0.25, 1, 0), (0.3, 0, 2), (0.5, 1, 1), (0.7, 1, 2)])
    v = VariantData(name="async", mode="async", steps=rows, evals=[], updates={0: 6})
    # clocks after each row (w0, w1): (1,0) (2,0) (2,1) (3,1) (3,2) (3,3)
    assert clock_gaps(v) == [1, 2, 0, 2, 0, 0]


def test_only_async_ssp_and_a_syncs_quorum_have_a_spread_of_staleness() -> None:
    def variant(mode: str, quorum: int = 0) -> VariantData:
        return VariantData(name=mode, mode=mode, steps=[], evals=[], updates={}, quorum=quorum)

    modes = ("sync", "async", "ssp", "ddp", "fsdp", "zero1")
    assert [m for m in modes if has_staleness(variant(m))] == ["async", "ssp"]
    assert has_staleness(variant("sync", quorum=2))  # its merges hold pushes of older weights
