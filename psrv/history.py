"""A process's history: one JSON event per line, for `psrv check` (docs/history.md).

A process records when PSRV_HISTORY names a directory (`psrv run` sets DIR/history). Each event is written
with one write(2) on a file opened O_APPEND, before the message it describes leaves, so a process killed
with SIGKILL has lost nothing it recorded. Without PSRV_HISTORY, `History.off()` records nothing.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import orjson

ENV = "PSRV_HISTORY"
_LINE = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS  # one line; a dict's int keys as strings, as json does


class History:
    """Events of one process life, in `path` (None: recorded nowhere)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._fd = None if path is None else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @classmethod
    def off(cls) -> "History":
        return cls(None)

    @classmethod
    def from_env(cls, name: str, environ=os.environ) -> "History":
        """DIR/<name>.<pid>.jsonl where PSRV_HISTORY names DIR (made if missing), else off()."""
        root = environ.get(ENV, "")
        if not root:
            return cls.off()
        Path(root).mkdir(parents=True, exist_ok=True)
        return cls(Path(root) / f"{name}.{os.getpid()}.jsonl")

    @property
    def on(self) -> bool:
        return self._fd is not None

    def record(self, ev: str, **fields) -> None:
        if self._fd is None:
            return
        os.write(self._fd, orjson.dumps({"ev": ev, "t": time.monotonic(), **fields}, default=_plain, option=_LINE))

    def start(self, role: str, **fields) -> None:
        """The first line: who this process is."""
        self.record("start", role=role, pid=os.getpid(), wall=time.time(), **fields)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _plain(value):
    """A set, a tuple of workers or a numpy/torch scalar as JSON."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not recordable: {type(value).__name__}")
