"""Progress that suits where it is written: tqdm's redrawn bar on a terminal; elsewhere (a CI log, a pipe,
a file) a plain line now and then, so a log gets a handful of lines instead of one per redraw.

A redrawn bar writes a carriage return and the whole bar every tenth of a second; in a log or a pipe each
of those is a line of its own. `progress_bar` gives the bar only when its stream is a terminal, and else a
`PlainProgress`: a line each time another tenth of the total is done, and one a minute while steps keep
coming without reaching it (or when the total is unknown)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

PLAIN_PERCENT = 10  # a plain line each time another this many percent of the total is done
PLAIN_SECONDS = 60.0  # ... and at least this often while steps are done


def is_terminal(stream: TextIO) -> bool:
    """True when `stream` is a terminal (redraws show as one bar there); False for a file, a pipe, a closed stream."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def progress_bar(*, total: int | None, desc: str, unit: str = "step", file: TextIO | None = None,
                 leave: bool = True, dynamic_ncols: bool = False):
    """A tqdm bar on a terminal, a PlainProgress elsewhere; both take update(n), set_description(desc), close()
    and `with`, and have `n`, the count so far."""
    file = sys.stderr if file is None else file
    if is_terminal(file):
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit=unit, file=file, leave=leave, dynamic_ncols=dynamic_ncols)
    return PlainProgress(total=total, desc=desc, unit=unit, file=file)


class PlainProgress:
    """Progress as plain lines, for a stream that is not a terminal: `DESC: 40/200 steps (20%), 12.5 steps/s`
    each time another PLAIN_PERCENT of `total` is done, or PLAIN_SECONDS after the last line when steps came
    since; close() writes the count where it stopped, if no line said it yet."""

    def __init__(self, *, total: int | None, desc: str, unit: str = "step", file: TextIO,
                 now=time.monotonic):
        self.total, self.desc, self.unit, self.file, self.now = total, desc, unit, file, now
        self.n = 0
        self.lines = 0
        self._started = self._said_at = now()
        self._said_n = 0
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._due():
            self._say()

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        if not self._closed and self.n != self._said_n:
            self._say()
        self._closed = True

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _due(self) -> bool:
        if self.n == self._said_n:
            return False
        if self.total and self._tenth(self.n) > self._tenth(self._said_n):
            return True
        return self.now() - self._said_at >= PLAIN_SECONDS

    def _tenth(self, n: int) -> int:
        return min(n, self.total) * 100 // (self.total * PLAIN_PERCENT)

    def _say(self) -> None:
        elapsed = self.now() - self._started
        done = f"{self.n}/{self.total}" if self.total else str(self.n)
        share = f" ({min(self.n, self.total) * 100 // self.total}%)" if self.total else ""
        rate = f", {self.n / elapsed:.3g} {self.unit}s/s" if elapsed > 0 else ""
        print(f"{self.desc}: {done} {self.unit}s{share}{rate}, {elapsed:.0f}s", file=self.file, flush=True)
        self._said_at, self._said_n = self.now(), self.n
        self.lines += 1
