"""Progress where stderr is not a terminal: a plain line every tenth of the total (or minute), never a redraw."""
from __future__ import annotations

import io

from tqdm import tqdm

from psrv.experiments.launcher.progress import PLAIN_SECONDS, PlainProgress, progress_bar


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_thousand_updates_make_ten_lines_one_per_tenth():
    out, clock = io.StringIO(), Clock()
    bar = PlainProgress(total=1000, desc="sync x2", file=out, now=clock)
    for _ in range(1000):
        clock.t += 0.01
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in out.getvalue(), lines
    assert lines[0].startswith("sync x2: 100/1000 steps (10%), 100 steps/s") and lines[-1].startswith("sync x2: 1000/1000 steps (100%)")


def test_without_a_total_a_line_a_minute_and_one_where_it_stopped():
    out, clock = io.StringIO(), Clock()
    with PlainProgress(total=None, desc="run", file=out, now=clock) as bar:
        for _ in range(600):  # 10 minutes, a step a second
            clock.t += 1.0
            bar.update(1)
        clock.t += 0.5
        bar.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 600 // PLAIN_SECONDS + 1, lines
    assert lines[-1].startswith("run: 601 steps,") and "%" not in lines[-1]


def test_a_stalled_run_says_nothing_more_and_a_terminal_gets_tqdm():
    out, clock = io.StringIO(), Clock()
    bar = PlainProgress(total=100, desc="run", file=out, now=clock)
    bar.update(5)
    clock.t += 10 * PLAIN_SECONDS  # the minute's line says the 5 steps
    bar.update(0)
    clock.t += 10 * PLAIN_SECONDS  # no step since: nothing new to say, now or at close()
    bar.update(0)
    bar.close()
    assert out.getvalue().splitlines() == ["run: 5/100 steps (5%), 0.00833 steps/s, 600s"]
    assert isinstance(progress_bar(total=10, desc="x", file=io.StringIO()), PlainProgress)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True
    bar = progress_bar(total=10, desc="x", file=Terminal())
    assert isinstance(bar, tqdm)
    bar.close()
