"""Start the DDP baseline's ranks (workers/ddp.py) on 127.0.0.1 with the env:// variables torchrun sets."""
from __future__ import annotations

import socket
import sys

from experiments.launch import Cluster, RunOptions, _optim_flags


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_flags(o: RunOptions) -> list[str]:
    """`python -m workers.ddp` flags for the run's job, data, optimizer and faults (the same for every rank)."""
    f = o.faults
    return ["--job", o.job, "--steps", str(o.steps), "--batch-size", str(o.batch_size), "--seed", str(o.seed),
            "--eval-every", str(o.eval_every), "--device", o.device, *_optim_flags(o),
            "--compute-ms", repr(f.compute_ms), "--straggler", f.straggler,
            "--transient-stragglers", f.transient_stragglers, "--net-delay-ms", repr(f.net_delay_ms)]


def start_ddp(cluster: Cluster, o: RunOptions) -> list[str]:
    """Start o.workers ranks named worker-R, writing DIR/worker-R.json (rank 0 also DIR/params.pt)."""
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(o.workers),
                  "LOCAL_WORLD_SIZE": str(o.workers), "GROUP_RANK": "0"}
    names = []
    for rank in range(o.workers):
        # the same argv for every rank, as under torchrun: workers/ddp.py fills in {rank}
        argv = [sys.executable, "-m", "workers.ddp", *ddp_flags(o), "--out", str(o.out / "worker-{rank}.json"),
                "--progress-file", str(o.out / "worker-{rank}.progress"), "--params-out", str(o.out / "params.pt")]
        env = {**rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        cluster.start(f"worker-{rank}", argv, env)
        names.append(f"worker-{rank}")
    return names
