"""Start the all-reduce baseline's ranks (python -m psrv.workers.allreduce) on 127.0.0.1 with the env:// variables torchrun sets."""
from __future__ import annotations

import sys
from pathlib import Path

from psrv.config import RunConfig

from psrv.experiments.cluster import Cluster, free_port


def start_ddp(cluster: Cluster, cfg: RunConfig, out: Path) -> list[str]:
    """Start cfg.cluster.workers ranks named worker-R, each given the run's DIR/config.json whole,
    writing DIR/worker-R.json (rank 0 also DIR/params.pt and DIR/model.pt)."""
    workers = cfg.cluster.workers
    rendezvous = {"MASTER_ADDR": cluster.address(0), "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(workers),
                  "LOCAL_WORLD_SIZE": str(workers), "GROUP_RANK": "0"}
    interface = getattr(cluster.hosts, "gloo_interface", None)
    if interface:  # each rank on an emulated host: gloo talks over its eth0
        rendezvous["GLOO_SOCKET_IFNAME"] = interface
    names = []
    for rank in range(workers):
        # the same argv for every rank, as under torchrun: psrv.workers.allreduce fills in {rank}
        argv = [sys.executable, "-P", "-m", "psrv.workers.allreduce", "--config", str(out / "config.json"),
                "--out", str(out / "worker-{rank}.json"), "--progress-file", str(out / "worker-{rank}.progress"),
                "--params-out", str(out / "params.pt"), "--state-out", str(out / "model.pt")]
        env = {**rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        cluster.start(f"worker-{rank}", argv, env, host=rank)
        names.append(f"worker-{rank}")
    return names
