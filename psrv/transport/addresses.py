"""Shard addresses as a worker is told them: comma-separated, in shard order, where an entry `@FILE` is
read from FILE, a server's `--ready-file`, once it exists. A launcher can then start the workers (which
import torch and load their data meanwhile) before the servers are up, and need not know the ports the
servers will bind. `psrv worker --servers` and psrv.Worker (its `servers=` or PSRV_SERVERS) both read
them here.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable


def resolve_addresses(entries: Iterable[str], *, wait: float) -> tuple[str, ...]:
    """The addresses of `entries`, each `@FILE` replaced by FILE's contents once FILE exists and is not
    empty (a server writes it atomically); ValueError naming FILE where it has not appeared within
    `wait` seconds (all files together)."""
    deadline, out = time.monotonic() + wait, []
    for item in (e.strip() for e in entries):
        if not item:
            continue
        if item.startswith("@"):
            item = _read_when_written(Path(item[1:]), deadline, wait)
        out.append(item)
    return tuple(out)


def split_addresses(text: str, *, wait: float) -> tuple[str, ...]:
    """resolve_addresses over a comma-separated list (as `--servers` and PSRV_SERVERS give it)."""
    return resolve_addresses(text.split(","), wait=wait)


def _read_when_written(path: Path, deadline: float, wait: float) -> str:
    while True:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            return text
        if time.monotonic() > deadline:
            raise ValueError(f"server address file {path} did not appear within {wait:g}s "
                             "(is the server with --ready-file that path running?)")
        time.sleep(0.02)
