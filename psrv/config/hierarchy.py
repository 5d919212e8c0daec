"""A hierarchy of servers (HALoS's shape, docs/algorithms.md "A hierarchy of servers"): the run's workers in
regions, each region's own shards serving its workers, and those shards syncing with global shards every K of
their updates. `HierarchySettings` is the run's section (`psrv run --regions`); `UpstreamSettings` is what a
regional shard is told (`psrv serve --upstream`); `check_hierarchy` and `check_upstream` refuse what the hierarchy does not carry."""
from __future__ import annotations

from dataclasses import dataclass

from psrv.config.address_form import address_problem
from psrv.config.base import ConfigError, Section, setting


@dataclass(frozen=True, kw_only=True)
class HierarchySettings(Section):
    """Regions of workers, each with shards of its own that sync with global shards (psrv run)."""

    regions: int = setting(1, "put the workers in R regions (contiguous ranks). With --region-every K > 0 each "
                           "region has shards of its own (async, the run's optimizer) that serve its workers and, "
                           "every K of their updates, push their change since the last sync to the global shards "
                           "(SGD with --global-lr and --global-momentum) and take back the global weights plus their "
                           "own updates since (HALoS's shape); with --region-every 0 every worker reaches the "
                           "global shards directly (the flat run, on the same hosts). With --bandwidth each region "
                           "is an emulated host (its shards and workers talk over its loopback) and the global "
                           "shards one more, the links between them capped. 1: no regions", minimum=1)
    region_every: int = setting(20, "a regional shard syncs with its global shard every K of its updates; 0: no "
                                "regional shards (see --regions)", minimum=0, metavar="K")
    global_lr: float = setting(1.0, "the global shards' learning rate on a region's pushed change (SGD; 1 with "
                               "momentum 0 adds each region's change as it is)", minimum=0.0, above=True)
    global_momentum: float = setting(0.0, "the global shards' momentum (torch.optim.SGD's heavy ball)",
                                     minimum=0.0, maximum=0.999)

    @property
    def tiered(self) -> bool:
        """Whether regions have shards of their own."""
        return self.regions > 1 and self.region_every > 0


@dataclass(frozen=True, kw_only=True)
class UpstreamSettings(Section):
    """A regional shard: the global shard it syncs with, and which of the run's ranks it serves."""

    upstream: str = setting("", "the global shard this shard syncs with (tcp://HOST:PORT, or @FILE: a ready file "
                            "to wait for): every --upstream-every of its updates it pushes its change since the "
                            "last sync there and takes the global weights plus its updates since; '' : none")
    upstream_every: int = setting(20, "updates between syncs with --upstream", minimum=1, metavar="K")
    region: int = setting(0, "this shard's region: its worker id at the global shard", minimum=0)
    upstream_world: int = setting(1, "regions in all: the global shard's workers", minimum=1)
    first_rank: int = setting(0, "the lowest rank this shard serves: its workers are ranks first_rank .. "
                              "first_rank + workers - 1 of the run", minimum=0)
    world_size: int = setting(0, "the world size the workers say (0: --workers): a region's shard serves some "
                              "of the run's ranks", minimum=0)


def region_of(rank: int, workers: int, regions: int) -> int:
    """The region of `rank` of `workers`: contiguous blocks, sizes differing by at most one."""
    return rank * regions // workers


def ranks_of(region: int, workers: int, regions: int) -> range:
    """The ranks of `region`."""
    ranks = [r for r in range(workers) if region_of(r, workers, regions) == region]
    return range(ranks[0], ranks[-1] + 1)


def check_hierarchy(run) -> None:
    """What `run` (a RunConfig) may combine with regions; a setting the hierarchy would not carry is refused."""
    h = run.hierarchy
    if h.regions == 1:
        for key, default in (("region_every", 20), ("global_lr", 1.0), ("global_momentum", 0.0)):
            if getattr(h, key) != default:
                raise ConfigError(f"hierarchy.{key}", "is for regions of workers: give --regions R (R > 1) too")
        return
    if run.is_allreduce:
        raise ConfigError("hierarchy.regions", f"places a parameter server's workers; mode {run.mode!r} has none")
    if h.regions > run.cluster.workers:
        raise ConfigError("hierarchy.regions", f"must be at most cluster.workers ({run.cluster.workers}), a worker or "
                                               f"more per region; got {h.regions}")
    if not h.tiered:
        for key, default in (("global_lr", 1.0), ("global_momentum", 0.0)):
            if getattr(h, key) != default:
                raise ConfigError(f"hierarchy.{key}", "is the global shards' under regional ones; with "
                                  "--region-every 0 the run's optimizer is the shards' (give --lr, --momentum)")
        return
    if run.mode != "async":
        raise ConfigError("hierarchy.regions", f"regional shards are asynchronous (HALoS's local servers); got mode "
                                               f"{run.mode!r}: give --mode async, or --region-every 0 for a flat run")
    refused = [(run.cluster.replicas, "cluster.replicas", "replicated shards"),
               (run.checkpoints.every, "checkpoints.every", "checkpointed shards"),
               (run.cluster.transport != "zmq", "cluster.transport", "torch RPC"),
               (run.kill.server, "kill.server", "a killed shard"),
               (run.kill.worker, "kill.worker", "a killed worker"),
               (run.nemesis.schedule, "nemesis.schedule", "a nemesis"),
               (run.restarts.workers, "restarts.workers", "restarted workers"),
               (run.worker.compress_pull, "worker.compress_pull", "compressed pulls (a sync moves the weights "
                                                                  "outside the copies they track)"),
               (run.job.script, "job.script", "a user's script")]
    for given, key, what in refused:
        if given:
            raise ConfigError(key, f"{what} and regional shards (--regions with --region-every > 0) are not built "
                                   "together: remove one")


def check_upstream(cfg) -> None:
    """`cfg` (a ServerConfig) as a regional shard (--upstream) is a lone asynchronous primary over zmq; its ranks fit its world."""
    if cfg.world_size and not cfg.first_rank + cfg.workers <= cfg.world_size:
        raise ConfigError("first_rank", f"ranks {cfg.first_rank}..{cfg.first_rank + cfg.workers - 1} do not fit "
                                        f"world_size {cfg.world_size}")
    if not cfg.region < cfg.upstream_world:
        raise ConfigError("region", f"must be in [0, upstream_world={cfg.upstream_world}); got {cfg.region}")
    if not cfg.upstream:
        return
    problem = "" if cfg.upstream.startswith("@") else address_problem(cfg.upstream, bind=False, schemes=("tcp",))
    if problem:
        raise ConfigError("upstream", problem)
    for given, key, what in ((cfg.mode != "async", "mode", f"mode {cfg.mode!r} (a regional shard is async)"),
                             (cfg.transport != "zmq", "transport", "torch RPC"),
                             (cfg.backup_of or cfg.witness, "backup_of", "replication"),
                             (cfg.checkpoint_dir, "checkpoint_dir", "checkpoints")):
        if given:
            raise ConfigError(key, f"{what} and --upstream are not built together: remove one")
