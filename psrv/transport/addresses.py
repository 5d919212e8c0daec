"""Shard addresses as a worker is told them: comma-separated, in shard order, where an entry `@FILE` is
read from FILE, a server's `--ready-file`, once it exists. A launcher can then start the workers (which
import torch and load their data meanwhile) before the servers are up, and need not know the ports the
servers will bind. `psrv worker --servers` and psrv.Worker (its `servers=` or PSRV_SERVERS) both read
them here, and each address is checked (psrv/config/address_form.py) before any socket is made: the
literal ones at once, before any wait, and each file's once it is read.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

from psrv.config.address_form import SCHEMES, check_address, check_shard_addresses


def resolve_addresses(entries: Iterable[str], *, wait: float, option: str = "--servers",
                      schemes: Iterable[str] = SCHEMES) -> tuple[str, ...]:
    """The addresses of `entries`, each `@FILE` replaced by FILE's contents once FILE exists and is not
    empty (a server writes it atomically); ValueError naming FILE where it has not appeared within
    `wait` seconds (all files together). A malformed address is a ValueError naming `option` (the flag,
    keyword or variable that gave the list), said before any file is waited for."""
    schemes = tuple(schemes)
    deadline, out = time.monotonic() + wait, []
    for item in check_shard_addresses(entries, option=option, schemes=schemes):
        if item.startswith("@"):
            item = check_address(_read_when_written(Path(item[1:]), deadline, wait),
                                 option=f"{option} {item}", schemes=schemes)
        out.append(item)
    return tuple(out)


def split_addresses(text: str, *, wait: float, option: str = "--servers",
                    schemes: Iterable[str] = SCHEMES) -> tuple[str, ...]:
    """resolve_addresses over a comma-separated list (as `--servers` and PSRV_SERVERS give it)."""
    return resolve_addresses(text.split(","), wait=wait, option=option, schemes=schemes)


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
