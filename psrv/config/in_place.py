"""pull_in_place's conditions (psrv/config/worker_settings.py): a worker computes on its shard's weights where they
lie in the shard's shared memory (psrv/transport/shm.py), so the shard must not write them while any worker
computes, and the model must lie in one shard's memory. `in_place_refusal` is the shard's side (its WELCOME says
whether it serves pulls in place); `check_in_place_run` is RunConfig's."""
from __future__ import annotations

from psrv.config.base import ConfigError


def in_place_refusal(cfg) -> str:
    """Why a shard of `cfg` (a ServerConfig or a RunConfig) may write its weights while a worker computes on them;
    '' where it never does: in sync without backup workers or a quorum it writes them only once every worker has
    pushed (a worker's push says it is done with them), and with one worker only at that worker's push."""
    workers = cfg.workers if hasattr(cfg, "workers") else cfg.cluster.workers
    if getattr(cfg, "upstream", "") or (hasattr(cfg, "hierarchy") and cfg.hierarchy.tiered):
        return "a regional shard takes its global shard's weights between its workers' pushes"
    if workers == 1 and cfg.mode in ("async", "ssp"):
        return ""
    if cfg.mode != "sync":
        return f"mode {cfg.mode!r} applies one worker's push while the others compute; needs mode sync (or one worker)"
    if cfg.backup_workers:
        return "with backup workers a clock commits while its slowest worker still computes"
    if cfg.quorum:
        return "with a quorum a merge commits while the other workers still compute"
    return ""


def check_in_place_run(run) -> None:
    """worker.pull_in_place against the rest of a run (RunConfig.validate)."""
    if not run.worker.pull_in_place:
        return
    why = in_place_refusal(run)
    if not why and run.cluster.servers != 1:
        why = f"needs one server: with {run.cluster.servers} the model's weights lie in several shards' memory"
    if not why and (run.cluster.transport != "zmq" or run.cluster.shared_memory == "off"):
        why = "reads the shard's shared memory: needs transport zmq and shared_memory auto"
    if not why and run.cluster.device != "cpu":
        why = f"maps the weights into host memory; a model on {run.cluster.device} copies them anyway: remove it"
    if why:
        raise ConfigError("worker.pull_in_place", why)
