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
import shutil
import signal
import time
from pathlib import Path
from typing import Callable

from psrv.atomic import write_json
from psrv.config import RunConfig, ServerConfig
from psrv.experiments.launcher.kills import ended, how_ended

log = logging.getLogger("psrv.run")


WITNESS = "witness"  # the run folder's witness directory: every replica's epochs (psrv/server/replication/witness.py)


def replicated(cfg: RunConfig, out: Path, config: ServerConfig) -> ServerConfig:
    """A shard process's config with the run's witness, where the run has replicas (unchanged otherwise)."""
    return dataclasses.replace(config, witness=str(out / WITNESS)) if cfg.cluster.replicas else config


def backup_names(cfg: RunConfig) -> list[tuple[int, str]]:
    """(shard, process name) of every backup the run starts."""
    return [(k, f"backup-{k}-{j}") for k in range(cfg.cluster.servers) for j in range(1, cfg.cluster.replicas + 1)]


def backup_host(cfg: RunConfig, shard: int, j: int) -> int:
    """The host (experiments/launcher/cluster.py, an emulated one with --bandwidth or a partition) of shard K's backup J:
    one of its own, after the primaries' and the workers', so a partition can cut it from its primary; a
    replacement (J > R) takes the place of backup ((J - 1) mod R) + 1."""
    c = cfg.cluster
    return c.servers + c.workers + shard * c.replicas + (j - 1) % c.replicas


Start = Callable[[str, int, int, ServerConfig, list[str]], None]  # (name, shard, host, config, argv tail)


def start_backups(cfg: RunConfig, out: Path, start: Start, *, bind: Callable[[int], str],
                  shards: list[int] | None = None) -> list[str]:
    """Start every shard's backups (or those of `shards`): each follows the address in its primary's ready file
    (DIR/server-K.addr) and announces its own in DIR/backup-K-J.addr; `start` starts one. `bind(host)`: where a
    backup on that host serves (over torch RPC the run's rendezvous, rpc://HOST:PORT, whose world it joins)."""
    names = []
    for shard, name in backup_names(cfg):
        if shards is not None and shard not in shards:
            continue
        host = backup_host(cfg, shard, int(name.rsplit("-", 1)[1]))
        config = dataclasses.replace(replicated(cfg, out, cfg.server_config(shard, bind=bind(host))),
                                     backup_of=f"@{out / f'server-{shard}.addr'}")
        (out / f"{name}.addr").unlink(missing_ok=True)
        start(name, shard, host, config, ["--out", str(out / f"{name}.json"), "--ready-file",
                                          str(out / f"{name}.addr")])
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
        waiting = [n for n in names if not (out / f"{n}.addr").exists()]  # a shard started again waits anew


class StartupRestarts:
    """A replica that dies before the workers start (killed while the backups were still joining, a crash at
    start-up) restarts its whole shard: nothing was acknowledged yet, so its replicas start afresh, with a
    fresh witness, and lose nothing; at most MAX_STARTS times per shard. Used as the cluster's `recover` until
    every backup follows (wait_following); `restart(shard)` starts shard K's primary and backups again."""

    MAX_STARTS = 3

    def __init__(self, out: Path, restart: Callable[[int], None]):
        self.out, self.restart = out, restart
        self.done: list[dict] = []

    def recover(self, cluster, name: str) -> bool:
        if not name.startswith(("server-", "backup-")):
            return False
        shard = int(name.split("-")[1])
        if sum(1 for r in self.done if r["shard"] == shard) >= self.MAX_STARTS:
            return False
        code = cluster.procs[name].returncode
        group = [n for n in cluster.procs if n == f"server-{shard}" or n.startswith(f"backup-{shard}-")]
        for n in group:  # the shard's other replicas stop too: it starts again whole
            proc = cluster.procs[n]
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            log_file = self.out / f"{n}.log"
            if log_file.exists():
                log_file.rename(self.out / f"{n}.log.start{len(self.done) + 1}")
            (self.out / f"{n}.addr").unlink(missing_ok=True)
        shutil.rmtree(self.out / WITNESS / f"shard-{shard}", ignore_errors=True)
        log.warning("%s died before the workers started (%s); shard %d starts again, with nothing lost", name,
                    f"signal {-code}" if code < 0 else f"exit code {code}", shard)
        self.done.append({"process": name, "shard": shard, **how_ended(code), "cause": ended(code),
                          "before_workers": True})
        self.restart(shard)
        return True


MAX_REPLACEMENTS = 50  # a shard whose replicas keep dying (a crash at start-up) goes on with fewer, not a loop


def start_replacement(cfg: RunConfig, out: Path, shard: int, start: Start, names: list[str], *,
                      bind: Callable[[int], str]) -> str | None:
    """A backup in place of one of shard's replicas that died (its primary or a backup), so the shard keeps
    cfg.cluster.replicas backups: it asks the primary the shard's witness names to take it, from its state. Its
    name is appended to `names`, and returned. None over torch RPC, whose world is fixed when it forms, and
    after MAX_REPLACEMENTS: the shard goes on with one replica fewer."""
    if cfg.cluster.transport == "rpc":
        log.warning("shard %d: a replica died; a torch RPC world takes no new member, so no backup replaces it "
                    "(the shard goes on with one replica fewer)", shard)
        return None
    taken = [n for n in names if n.startswith(f"backup-{shard}-")]
    if len(taken) >= cfg.cluster.replicas + MAX_REPLACEMENTS:
        log.warning("shard %d: %d replicas replaced already; this one is not", shard, MAX_REPLACEMENTS)
        return None
    j = len(taken) + 1
    name, host = f"backup-{shard}-{j}", backup_host(cfg, shard, j)
    candidates = ",".join(f"@{out / f'{n}.addr'}" for n in [f"server-{shard}", *taken])  # the witness says which
    config = dataclasses.replace(replicated(cfg, out, cfg.server_config(shard, bind=bind(host))),
                                 backup_of=candidates)
    start(name, shard, host, config, ["--out", str(out / f"{name}.json"), "--ready-file", str(out / f"{name}.addr")])
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
    """After the run, each shard's record DIR/server-K.json is the record of the replica that served it last: the
    primary of its highest epoch that was not fenced (a backup that took over, or the first primary). A first
    primary replaced meanwhile (killed, or paused and fenced: its own record counts what it applied until then)
    keeps its record as DIR/replaced-server-K.json. Returns summary.json's `replication`."""
    backups = _records(out, "backup-*-*.json")
    failovers = sorted(({"shard": b["shard"], "new_primary": b.get("address"), **f}
                        for b in backups for f in b.get("failovers", [])), key=lambda f: f["at"])
    epochs = {str(k): _epochs(out / WITNESS / f"shard-{k}") for k in range(cfg.cluster.servers)}
    recorded = {(f["shard"], f["epoch"]) for f in failovers}  # a replica killed after it took over wrote no record
    failovers += [{"shard": int(k), "new_primary": e["primary"], "epoch": e["epoch"], "at": e["at"], "why": e["why"]}
                  for k, shard in epochs.items() for e in shard
                  if e["why"].startswith("take over") and (int(k), e["epoch"]) not in recorded]
    failovers.sort(key=lambda f: f["at"])
    for shard in range(cfg.cluster.servers):
        own = out / f"server-{shard}.json"
        first = _records(out, own.name)
        served = [r for r in first + [b for b in backups if b["shard"] == shard]
                  if r.get("role") == "primary" and not r.get("fenced")]
        if not served:
            continue
        last = max(served, key=lambda r: r.get("epoch", 0))
        if first and last is first[0]:
            continue
        if first:
            own.rename(out / f"replaced-server-{shard}.json")
        write_json(own, {**last, "took_over": True})
    return {"replicas": cfg.cluster.replicas, "failovers": failovers,
            "epochs": {k: len(v) for k, v in epochs.items()}, "witness": str(out / WITNESS)}


def _epochs(folder: Path) -> list[dict]:
    """A shard's configurations as its witness holds them (psrv/server/replication/witness.py), in epoch order."""
    found = []
    for path in folder.glob("epoch-*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:
            continue
    return sorted(found, key=lambda e: e["epoch"])
