"""Start the all-reduce baseline's ranks (python -m psrv.workers.allreduce), on 127.0.0.1 or each on an
emulated host, with the env:// variables torchrun sets."""
from __future__ import annotations

import sys
from pathlib import Path

from psrv.config import RunConfig

from psrv.experiments.launcher.cluster import Cluster, free_port
from psrv.experiments.launcher.stall import beacon_path


def start_ddp(cluster: Cluster, cfg: RunConfig, out: Path) -> list[str]:
    """Start cfg.cluster.workers ranks named worker-R, each given the run's DIR/config.json whole,
    writing DIR/worker-R.json (rank 0 also DIR/params.pt and DIR/model.pt)."""
    workers = cfg.cluster.workers
    rendezvous = {**rendezvous_env(cluster, workers), "WORLD_SIZE": str(workers), "GROUP_RANK": "0"}
    names = []
    for rank in range(workers):
        env = {**rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        argv = allreduce_argv(str(out / "config.json"), str(out))
        cluster.start(f"worker-{rank}", argv, env, host=rank)
        names.append(f"worker-{rank}")
    return names


def rendezvous_env(cluster: Cluster, workers: int) -> dict[str, str]:
    """torch.distributed's env:// rendezvous for `workers` ranks, rank R on host R: MASTER_ADDR on host 0's
    address (127.0.0.1 without emulated hosts), and with emulated hosts gloo's interface, its host's eth0
    (shared with a script's all-reduce ranks, experiments/launcher/script.py)."""
    env = {"MASTER_ADDR": cluster.address(0), "MASTER_PORT": str(free_port()), "LOCAL_WORLD_SIZE": str(workers)}
    interface = getattr(cluster.hosts, "gloo_interface", None)
    if interface:  # each rank on an emulated host: gloo talks over its eth0
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


def allreduce_argv(config: str, out: str, *, python: str = sys.executable) -> list[str]:
    """Every rank's argv, the same for all as under torchrun (psrv.workers.allreduce fills in {rank} from
    RANK; rank 0 alone writes params.pt and model.pt): the local launcher's and the scheduler's manifests'."""
    return [python, "-P", "-m", "psrv.workers.allreduce", "--config", config, "--out", f"{out}/worker-{{rank}}.json",
            "--progress-file", f"{out}/worker-{{rank}}.progress", "--beacon-file", beacon_path(out),
            "--params-out", f"{out}/params.pt",
            "--state-out", f"{out}/model.pt"]
