"""Atomic file writes: the old file or the new one, never a torn one, for every file psrv writes that
another process or a later run reads (records, configs, ready files, checkpoints, caches)."""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import IO, Any, Iterator


@contextlib.contextmanager
def replacing(path: str | Path, mode: str = "w", *, durable: bool = False, **open_args: Any) -> Iterator[IO]:
    """A file to write that takes `path`'s place when the block ends (os.replace), and is removed if the
    block raises. The temporary file is `.NAME.PID.tmp` beside it, so concurrent writers never share one.
    `durable`: fsync the file and the folder, so the new file survives a crash of the machine."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, **open_args) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself
        finally:
            os.close(fd)


def write_text(path: str | Path, text: str) -> None:
    with replacing(path, encoding="utf-8") as f:
        f.write(text)


def write_json(path: str | Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=1))
