"""A local run's backups (`psrv run --replicas R`, spec key cluster.replicas): R `psrv serve --backup-of` per
shard, started beside its primary, named backup-K-J (shard K, backup J), each writing DIR/backup-K-J.json.

A dead primary is not restarted: its backup takes over (psrv/server/follower.py) and the run goes on, and a
new backup is started in its place, which joins whichever replica took over (not over torch RPC, whose world
is fixed when it forms: the backups join it as backup-K-J, and the shard goes on with one replica fewer). At the end, a shard whose
primary died has its record DIR/server-K.json written from the backup that took over, and summary.json's
`replication` says how many replicas each shard had and every failover: when, which shard, the address of
the new primary and the version it took over at (docs/reliability.md)."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Callable

from psrv.atomic import write_json
from psrv.config import RunConfig, ServerConfig

log = logging.getLogger("psrv.run")


def backup_names(cfg: RunConfig) -> list[tuple[int, str]]:
    """(shard, process name) of every backup the run starts."""
    return [(k, f"backup-{k}-{j}") for k in range(cfg.cluster.servers) for j in range(1, cfg.cluster.replicas + 1)]


def start_backups(cfg: RunConfig, out: Path, start: Callable[[str, int, ServerConfig, list[str]], None], *,
                  bind: str = "tcp://127.0.0.1:0") -> list[str]:
    """Start every shard's backups: each follows the address in its primary's ready file (DIR/server-K.addr)
    and announces its own in DIR/backup-K-J.addr; `start(name, shard, config, argv tail)` starts one. `bind`:
    where a backup serves (over torch RPC the run's rendezvous, rpc://HOST:PORT, whose world it joins)."""
    names = []
    for shard, name in backup_names(cfg):
        config = dataclasses.replace(cfg.server_config(shard, bind=bind), backup_of=f"@{out / f'server-{shard}.addr'}")
        (out / f"{name}.addr").unlink(missing_ok=True)
        start(name, shard, config, ["--out", str(out / f"{name}.json"), "--ready-file", str(out / f"{name}.addr")])
        names.append(name)
    return names


def wait_following(cluster, out: Path, names: list[str], timeout: float = 120.0) -> None:
    """Return once every backup in `names` follows its primary (it writes DIR/<name>.addr then, psrv/server/run.py),
    so the workers started next are welcomed with every replica and none joins late: a worker told of no backup
    has nowhere to fail over to, and a backup that joins after the first pushes counts fewer than its primary.
    RunFailed (cluster.check) if a process dies meanwhile; RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    waiting = [n for n in names if not (out / f"{n}.addr").exists()]
    while waiting:
        cluster.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{', '.join(waiting)} did not follow its primary within {timeout:g}s; see "
                               f"{out / (waiting[0] + '.log')}")
        time.sleep(0.05)
        waiting = [n for n in waiting if not (out / f"{n}.addr").exists()]


def start_replacement(cfg: RunConfig, out: Path, shard: int,
                      start: Callable[[str, int, ServerConfig, list[str]], None], names: list[str]) -> str | None:
    """A backup in place of shard's dead primary, so the shard keeps cfg.cluster.replicas backups: it asks each
    of the shard's backups in turn until the one that took over sends it the state (`--backup-of` with
    their ready files, comma-separated). Its name is appended to `names`, and returned. None over torch RPC,
    whose world is fixed when it forms: the shard goes on with one replica fewer."""
    if cfg.cluster.transport == "rpc":
        log.warning("shard %d: its primary died; a torch RPC world takes no new member, so no backup replaces it "
                    "(the shard goes on with one replica fewer)", shard)
        return None
    taken = [n for n in names if n.startswith(f"backup-{shard}-")]
    name = f"backup-{shard}-{len(taken) + 1}"
    replicas = ",".join(f"@{out / f'{n}.addr'}" for n in taken)
    config = dataclasses.replace(cfg.server_config(shard, bind="tcp://127.0.0.1:0"), backup_of=replicas)
    start(name, shard, config, ["--out", str(out / f"{name}.json"), "--ready-file", str(out / f"{name}.addr")])
    names.append(name)
    return name


def _records(out: Path, pattern: str) -> list[dict]:
    records = []
    for path in sorted(out.glob(pattern)):
        try:
            records.append(json.loads(path.read_text()))
        except ValueError:
            continue
    return records


def settle(cfg: RunConfig, out: Path) -> dict:
    """After the run: DIR/server-K.json for each shard whose primary died, from the backup that took over
    (the last to, where several did); summary.json's `replication`."""
    backups = _records(out, "backup-*-*.json")
    failovers = sorted(({"shard": b["shard"], "new_primary": b.get("address"), **f}
                        for b in backups for f in b.get("failovers", [])), key=lambda f: f["at"])
    for shard in range(cfg.cluster.servers):
        took = [b for b in backups if b["shard"] == shard and b.get("failovers")]
        if took and not (out / f"server-{shard}.json").exists():
            record = max(took, key=lambda b: b["epoch"])
            write_json(out / f"server-{shard}.json", {**record, "took_over": True})
    return {"replicas": cfg.cluster.replicas, "failovers": failovers}
