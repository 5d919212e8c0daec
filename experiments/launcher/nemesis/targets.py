"""Which processes shard K's current primary and backups are: the witness's latest configuration of the shard
(DIR/witness/shard-K/epoch-E.json, the highest E), each address mapped to the process that announced it in
DIR/<name>.addr; before any witness file, server-K is the primary and the backup-K-J that announced themselves
its backups."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

WITNESS = "witness"  # DIR/witness/shard-K/epoch-E.json: {"epoch": E, "primary": ADDRESS, "backups": [ADDRESS...]}
_EPOCH = re.compile(r"epoch-(\d+)\.json")


@dataclass(frozen=True)
class Configuration:
    """Shard `shard`'s replicas now, as process names; `epoch` None: no witness file (the start's layout);
    `unknown`: addresses the witness names that no DIR/<name>.addr holds."""

    shard: int
    epoch: int | None
    primary: str | None
    backups: tuple[str, ...]
    unknown: tuple[str, ...] = ()


def announced(out: Path) -> dict[str, str]:
    """address -> process name, from every DIR/<name>.addr (a primary's, a backup's)."""
    names = {}
    for path in sorted(out.glob("*.addr")):
        try:
            address = path.read_text().strip()
        except OSError:
            continue
        if address:
            names[address] = path.stem
    return names


def latest(out: Path, shard: int) -> dict | None:
    """The witness's file of shard `shard` with the highest epoch that reads as JSON; None: none yet."""
    folder = out / WITNESS / f"shard-{shard}"
    epochs = sorted(((int(m[1]), p) for p in folder.glob("epoch-*.json") if (m := _EPOCH.fullmatch(p.name))),
                    reverse=True)
    for _, path in epochs:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # one being written: the one before it
    return None


def configuration(out: Path, shard: int) -> Configuration:
    """Shard `shard`'s current primary and backups (process names)."""
    witness = latest(out, shard)
    names = announced(out)
    if witness is None:
        backups = sorted(p.stem for p in out.glob(f"backup-{shard}-*.addr"))
        return Configuration(shard, None, f"server-{shard}", tuple(backups))
    addresses = [witness.get("primary"), *witness.get("backups", [])]
    unknown = tuple(a for a in addresses if a and a.strip() not in names)
    primary = names.get((witness.get("primary") or "").strip())
    backups = tuple(names[a.strip()] for a in witness.get("backups", []) if a.strip() in names)
    return Configuration(shard, int(witness.get("epoch", -1)), primary, backups, unknown)
