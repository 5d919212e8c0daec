"""The witness of a replicated shard: the one place its epochs are decided (docs/reliability.md, "Fencing").

A shard's configuration (its epoch, its primary, its backups) changes only by a claim on the witness: a
backup taking over, a primary adding a backup that asked to join, a primary dropping a backup that stopped
acknowledging. The witness is a directory every replica of the shard reaches (a run folder's
DIR/witness; across hosts, a shared filesystem), holding one file per epoch, `shard-K/epoch-E.json`.
Claiming epoch E is creating that file with link(2), which fails when it exists: of two replicas claiming
the same epoch (a backup taking over while its primary drops it, two backups taking over at once) exactly
one wins, and the other reads who did. A replica that lost a claim has been fenced or replaced, and acts
on the configuration it read instead of its own. The file system is the lock, so nothing else runs: no
witness process to lose, no lease whose timing a paused process could outlive.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

_EPOCH = re.compile(r"epoch-(\d+)\.json")


@dataclass(frozen=True)
class Configuration:
    """Who serves the shard in `epoch`: `primary` acknowledges, once every one of `backups` holds a push."""

    epoch: int
    primary: str
    backups: tuple[str, ...] = ()
    why: str = ""
    at: float = field(default=0.0, compare=False)  # time.time() of the claim, for people reading the files

    def without(self, address: str, *, why: str) -> "Configuration":
        return Configuration(self.epoch + 1, self.primary, tuple(b for b in self.backups if b != address), why)

    def adding(self, address: str, *, why: str) -> "Configuration":
        backups = tuple(b for b in self.backups if b != address) + (address,)
        return Configuration(self.epoch + 1, self.primary, backups, why)

    @property
    def finished(self) -> bool:
        """The shard's last configuration: every worker left, and no replica serves it any more."""
        return not self.primary

    def ended(self) -> "Configuration":
        return Configuration(self.epoch + 1, "", (), "finished: every worker left")

    def taken_over_by(self, address: str, *, why: str) -> "Configuration":
        """The next epoch with `address` as primary, alone: the other backups join it again, from its state."""
        return Configuration(self.epoch + 1, address, (), why)


class Witness:
    """Shard `shard`'s epochs under `root` (made if missing)."""

    def __init__(self, root: str | Path, shard: int):
        self.dir = Path(root) / f"shard-{shard}"
        self.dir.mkdir(parents=True, exist_ok=True)

    def latest(self) -> Configuration | None:
        """The configuration of the highest epoch claimed so far; None before the first."""
        epochs = [int(m.group(1)) for m in map(_EPOCH.fullmatch, os.listdir(self.dir)) if m]
        for epoch in sorted(epochs, reverse=True):
            config = self.read(epoch)
            if config is not None:
                return config
        return None

    def read(self, epoch: int) -> Configuration | None:
        try:
            data = json.loads((self.dir / f"epoch-{epoch}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return Configuration(int(data["epoch"]), str(data["primary"]), tuple(data.get("backups", ())),
                             str(data.get("why", "")), float(data.get("at", 0.0)))

    def claim(self, config: Configuration) -> tuple[bool, Configuration]:
        """Try to make `config` the shard's, at its epoch: (True, config) if this call created that epoch,
        else (False, the latest configuration), someone else having claimed it first. OSError (a full
        disk, a witness out of reach) is raised: no claim was made, and the caller may try again."""
        config = Configuration(config.epoch, config.primary, tuple(config.backups), config.why, time.time())
        final = self.dir / f"epoch-{config.epoch}.json"
        temporary = self.dir / f".epoch-{config.epoch}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        try:
            temporary.write_text(json.dumps(asdict(config)))  # a full disk fails here: nothing claimed, nothing left
            os.link(temporary, final)  # atomic, and fails if the epoch was claimed: the compare-and-set
            return True, config
        except FileExistsError:
            return False, self.latest() or config
        finally:
            temporary.unlink(missing_ok=True)
