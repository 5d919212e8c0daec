"""`psrv run --script FILE.py ARGS...`: a user's own loop on psrv.Worker as the run's workers.

Each worker is `python FILE.py ARGS...` with these set:
- RANK and WORLD_SIZE;
- PSRV_MODE, the run's mode, and PSRV_CONFIG, its resolved config (DIR/config.json);
- in sync, async and ssp, PSRV_SERVERS: the shards' addresses, comma-separated, in shard order;
- in ddp and zero1 (no shards), torch.distributed's env:// rendezvous, as torchrun sets it: LOCAL_RANK,
  LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; psrv.Worker is then the all-reduce worker
  (psrv/worker/allreduce.py), which reads the optimizer, schedule and clip from PSRV_CONFIG;
- the variables psrv/worker/steplog.py reads (PSRV_RECORD, PSRV_PROGRESS, rank 0's PSRV_PARAMS_OUT), so
  its psrv.Worker writes DIR/worker-R.json as `psrv worker --out` does;
- PSRV_STEPS: `--steps`, when typed, for the script to read.
The options only the shipped loop reads are refused, and so is fsdp (psrv/worker/allreduce.py says why).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from psrv.config import RunConfig
from psrv.config.base import default_of, leaves
from psrv.config.cli_args import flag_of
from psrv.device import check_device

from psrv.experiments.cluster import Cluster, RunFailed, free_port

# Read by the shipped loop alone: a script decides these itself, so a value given here would do nothing.
_SHIPPED_ONLY = ("job.name", "job.batch_size", "job.eval_every", "seed", "faults.", "worker.")


@dataclass(frozen=True)
class Script:
    """The script and its arguments; `steps`: --steps as typed (PSRV_STEPS), None when not."""

    path: Path
    args: tuple[str, ...] = ()
    steps: int | None = None

    @property
    def argv(self) -> list[str]:
        return [str(self.path), *self.args]


def script_from_args(words: list[str], cfg: RunConfig, typed: set[str]) -> Script:
    """The Script of `--script FILE.py ARGS...` (`words`); ValueError, in one line, for an option it
    cannot use (`typed`: the dotted keys given on the command line)."""
    if not words or words[0].startswith("-"):
        raise ValueError("--script: name the script right after it (--script FILE.py ARGS...); psrv's own "
                         "options go before --script")
    path = Path(words[0])
    if not path.is_file():
        raise ValueError(f"--script: no such file: {path}")
    if cfg.mode == "fsdp":
        raise ValueError("--mode fsdp: not with --script: fully_shard would turn the model's parameters into sharded "
                         "DTensors behind the script's back; use --mode ddp or zero1")
    if cfg.cluster.transport != "zmq":
        raise ValueError("--transport: --script workers reach the shards over zmq (psrv.Worker's default)")
    for key, f, s in leaves(RunConfig):
        from_file = key.startswith(("faults.", "worker.")) and _get(cfg, key) != default_of(f)  # --config FILE's
        if key.startswith(_SHIPPED_ONLY) and (key in typed or from_file):
            raise ValueError(f"{flag_of(key, s)}: not used with --script (the shipped loop's setting; your "
                             "script decides it); remove it")
        if key.startswith("allreduce.") and (key in typed or _get(cfg, key) != default_of(f)):
            raise ValueError(f"{flag_of(key, s)}: not used with --script (psrv.Worker all-reduces the plain mean "
                             "gradient); remove it")
    check_device(cfg.cluster.device)
    return Script(path, tuple(words[1:]), cfg.job.steps if "job.steps" in typed else None)


def start_script_workers(cluster: Cluster, cfg: RunConfig, out: Path, script: Script,
                         servers: list[tuple[str, str]], *, metrics: bool, linger: float) -> list[str]:
    """Start the script once per rank (`servers`: (name, address) of each shard, in shard order; none in
    an all-reduce mode, whose ranks meet at a rendezvous on 127.0.0.1 instead)."""
    workers = cfg.cluster.workers
    run = {"WORLD_SIZE": str(workers), "PSRV_MODE": cfg.mode, "PSRV_CONFIG": str(out / "config.json")}
    if cfg.is_allreduce:
        run.update(LOCAL_WORLD_SIZE=str(workers), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    else:
        run["PSRV_SERVERS"] = ",".join(address for _, address in servers)
    names = []
    for rank in range(workers):
        env = {**run, "RANK": str(rank), **({"LOCAL_RANK": str(rank)} if cfg.is_allreduce else {}),
               "PSRV_RECORD": str(out / f"worker-{rank}.json"), "PSRV_PROGRESS": str(out / f"worker-{rank}.progress"),
               **({"PSRV_PARAMS_OUT": str(out / "params.pt")} if rank == 0 else {}),
               **({"PSRV_STEPS": str(script.steps)} if script.steps is not None else {}),
               # no /metrics from all-reduce ranks: the shipped ones (launch_ddp.py) serve none either
               **({"PSRV_METRICS_PORT": "0", "PSRV_METRICS_LINGER": repr(linger)}
                  if metrics and not cfg.is_allreduce else {})}
        cluster.start(f"worker-{rank}", [sys.executable, *script.argv], env=env, brief=f"rank {rank} ({script.path})")
        names.append(f"worker-{rank}")
    return names


def check_records(cluster: Cluster, out: Path, names: list[str], script: Script) -> None:
    """RunFailed, in one line, for a rank that exited 0 without writing its record."""
    for rank, name in enumerate(names):
        path = out / f"{name}.json"
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            raise RunFailed(f"rank {rank} ({script.path}) exited 0 without writing {path}: end the loop with "
                            f"ps.close() (or a `with psrv.Worker(...)` block); its output: {out / (name + '.log')}")


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg
