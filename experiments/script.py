"""`psrv run --script FILE.py ARGS...`: a user's own loop on psrv.Worker as the run's workers.

Each worker is `python FILE.py ARGS...` with RANK, WORLD_SIZE and PSRV_SERVERS (the shards' addresses,
comma-separated, in shard order) set, and the variables psrv/worker/steplog.py reads, so its psrv.Worker
writes DIR/worker-R.json as `psrv worker --out` does. `--steps`, when typed, is handed over as
PSRV_STEPS for the script to read. The options only the shipped loop reads are refused.
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

from psrv.experiments.cluster import Cluster, RunFailed

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
    if cfg.is_allreduce:
        raise ValueError(f"--script runs a psrv.Worker loop (sync, async, ssp); a DDP script is torchrun's to "
                         f"start (mode is {cfg.mode!r})")
    if cfg.cluster.transport != "zmq":
        raise ValueError("--transport: --script workers reach the shards over zmq (psrv.Worker's default)")
    for key, f, s in leaves(RunConfig):
        from_file = key.startswith(("faults.", "worker.")) and _get(cfg, key) != default_of(f)  # --config FILE's
        if key.startswith(_SHIPPED_ONLY) and (key in typed or from_file):
            raise ValueError(f"{flag_of(key, s)}: not used with --script (the shipped loop's setting; your "
                             "script decides it); remove it")
    check_device(cfg.cluster.device)
    return Script(path, tuple(words[1:]), cfg.job.steps if "job.steps" in typed else None)


def start_script_workers(cluster: Cluster, cfg: RunConfig, out: Path, script: Script,
                         servers: list[tuple[str, str]], *, metrics: bool, linger: float) -> list[str]:
    """Start the script once per rank (`servers`: (name, address) of each shard, in shard order)."""
    addresses = ",".join(address for _, address in servers)
    names = []
    for rank in range(cfg.cluster.workers):
        env = {"RANK": str(rank), "WORLD_SIZE": str(cfg.cluster.workers), "PSRV_SERVERS": addresses,
               "PSRV_RECORD": str(out / f"worker-{rank}.json"), "PSRV_PROGRESS": str(out / f"worker-{rank}.progress"),
               **({"PSRV_PARAMS_OUT": str(out / "params.pt")} if rank == 0 else {}),
               **({"PSRV_STEPS": str(script.steps)} if script.steps is not None else {}),
               **({"PSRV_METRICS_PORT": "0", "PSRV_METRICS_LINGER": repr(linger), "PSRV_MODE": cfg.mode}
                  if metrics else {})}
        cluster.start(f"worker-{rank}", [sys.executable, *script.argv], env=env, brief=f"rank {rank} ({script.path})",
                      host=cfg.cluster.servers + rank)
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
