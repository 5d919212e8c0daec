"""`psrv run --regions R`: the workers in R regions (psrv/config/hierarchy.py).

Where a process runs: with --bandwidth, host 0 holds the global shards (or, with --region-every 0, the run's
one set of shards) and host 1 + r region r's shards and workers, which talk over that host's own loopback;
between hosts every link is capped. Without --bandwidth everything is on 127.0.0.1.

With --region-every K > 0, region r's shards are processes server-(r*S + i) (S = cluster.servers), each
syncing with global shard i (process global-i; psrv/server/hierarchy/upstream.py), and rank w reaches its
region's S shards. The records: OUT/server-K.json for the regional shards, OUT/global-I.json for the global.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable

from psrv.config import OptimConfig, RunConfig, ServerConfig
from psrv.config.hierarchy import ranks_of, region_of


def hosts_needed(cfg: RunConfig) -> int:
    """Emulated hosts the run needs with --bandwidth: one per region and one for the global shards."""
    return cfg.hierarchy.regions + 1


def worker_host(cfg: RunConfig, rank: int) -> int:
    return 1 + region_of(rank, cfg.cluster.workers, cfg.hierarchy.regions)


def global_config(cfg: RunConfig, shard: int, *, bind: str) -> ServerConfig:
    """Global shard `shard`: asynchronous, its workers the regions, SGD at --global-lr and --global-momentum."""
    h = cfg.hierarchy
    optimizer = OptimConfig(name="sgd", lr=h.global_lr, momentum=h.global_momentum)
    return replace(cfg.server_config(shard, bind=bind), mode="async", workers=h.regions, optimizer=optimizer,
                   backup_workers=0, quorum=0)


def regional_config(cfg: RunConfig, region: int, shard: int, *, bind: str, upstream: str) -> ServerConfig:
    """Region `region`'s shard `shard`: the run's shard config for that region's ranks, syncing with `upstream`."""
    ranks = ranks_of(region, cfg.cluster.workers, cfg.hierarchy.regions)
    return replace(cfg.server_config(shard, bind=bind), workers=len(ranks), first_rank=ranks.start,
                   world_size=cfg.cluster.workers, upstream=upstream, upstream_every=cfg.hierarchy.region_every,
                   region=region, upstream_world=cfg.hierarchy.regions)


def start_tiers(cfg: RunConfig, out: Path, address: Callable[[int], str],
                start: Callable[[str, int, ServerConfig, Path], None]) -> tuple[list[tuple[str, str]], list[list[str]]]:
    """Start the global shards, then each region's; `start(name, host, config, ready_file)` starts one.
    Returns (name, address) of every shard started and each region's shard addresses (@FILE, in shard order)."""
    servers, by_region = [], []
    for i in range(cfg.cluster.servers):
        ready = out / f"global-{i}.addr"
        ready.unlink(missing_ok=True)
        start(f"global-{i}", 0, global_config(cfg, i, bind=f"tcp://{address(0)}:0"), ready)
        servers.append((f"global-{i}", f"@{ready}"))
    for r in range(cfg.hierarchy.regions):
        mine = []
        for i in range(cfg.cluster.servers):
            k = r * cfg.cluster.servers + i
            ready = out / f"server-{k}.addr"
            ready.unlink(missing_ok=True)
            start(f"server-{k}", 1 + r, regional_config(cfg, r, i, bind=f"tcp://{address(1 + r)}:0",
                                                         upstream=f"@{out / f'global-{i}.addr'}"), ready)
            servers.append((f"server-{k}", f"@{ready}"))
            mine.append(f"@{ready}")
        by_region.append(mine)
    return servers, by_region


def summary(cfg: RunConfig, out: Path) -> dict:
    """summary.json's `hierarchy`: the regions, and where the regions' syncs went (each regional shard's count,
    bytes and seconds; each global shard's updates, one per sync)."""
    h = cfg.hierarchy
    if h.regions == 1:
        return {}
    block = {"regions": h.regions, "region_every": h.region_every,
             "ranks": [list(ranks_of(r, cfg.cluster.workers, h.regions)) for r in range(h.regions)]}
    if h.tiered:
        regional = [_read(out / f"server-{k}.json") for k in range(h.regions * cfg.cluster.servers)]
        ups = [r.get("upstream", {}) for r in regional if r]
        block.update({"global_lr": h.global_lr, "global_momentum": h.global_momentum,
                      "syncs": sum(u.get("syncs", 0) for u in ups),
                      "sync_bytes": sum(u.get("bytes_sent", 0) + u.get("bytes_received", 0) for u in ups),
                      "sync_seconds": round(sum(u.get("seconds", 0.0) for u in ups), 4),
                      "global_updates": [(_read(out / f"global-{i}.json") or {}).get("version")
                                         for i in range(cfg.cluster.servers)]})
    return {"hierarchy": block}


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
