"""A user's own loop on psrv.Worker as the run's workers: `psrv run --script FILE.py ARGS...`, or a spec's
`[job] script = "FILE.py"` with `script_args = [...]`.

The script is part of the run's config (job.script, job.script_args, and job.script_sha256, the file's
hash when the run was configured), so a spec's reuse by config hash reruns a run whose script changed.
Each worker is `python FILE.py ARGS...`, its output in DIR/worker-R.log, with these set (script_env):
- RANK and WORLD_SIZE, and PSRV_SEED, the run's seed;
- PSRV_MODE, the run's mode, and PSRV_CONFIG, its resolved config (DIR/config.json);
- in sync, async and ssp, PSRV_SERVERS: the shards' addresses, comma-separated, in shard order;
- in ddp and zero1 (no shards), torch.distributed's env:// rendezvous, as torchrun sets it: LOCAL_RANK,
  LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (on emulated hosts, `--bandwidth`: rank 0's host's address,
  and GLOO_SOCKET_IFNAME=eth0); psrv.make_worker is then the all-reduce worker (psrv/client/allreduce.py), which
  reads the optimizer, schedule and clip from PSRV_CONFIG;
- the variables psrv/client/steplog.py reads (PSRV_RECORD, PSRV_PROGRESS, rank 0's PSRV_PARAMS_OUT), so
  its psrv.Worker writes DIR/worker-R.json as `psrv worker --out` does; in ddp and zero1 also PSRV_BEACON,
  the step beacon the launcher's stall watch reads (experiments/launcher/stall.py);
- PSRV_STEPS: `--steps` (a spec's job.steps), when given, for the script to read.
The run's worker settings (compress, local_steps, ...) reach the script's psrv.Worker(model) through PSRV_CONFIG
(psrv/client/run_settings.py). The options only the shipped loop reads (the job, its batch size and evaluations,
the faults, the inner optimizer) are refused, as is any worker setting under ddp and zero1, and fsdp
(psrv/client/allreduce.py says why).

The launcher (`--launcher`) says how the workers are started, not what they compute: `psrv` starts one
process per rank (this module); `torchrun` starts them all as one torchrun process (experiments/launcher/torchrun.py).
Both give every rank the same environment but RANK (torchrun sets it): the record paths are templates
with `{rank}`, which each rank's psrv.Worker fills in.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from psrv.config import RunConfig
from psrv.config.sections import WorkerSettings
from psrv.config.base import default_of, leaves
from psrv.config.cli_args import flag_of
from psrv.device import check_device

from psrv.experiments.launcher.cluster import Cluster, RunFailed
from psrv.experiments.launcher.launch_ddp import rendezvous_env
from psrv.experiments.launcher.stall import beacon_path

# Read by the shipped loop alone: a script decides these itself, so a value given here would do nothing. The
# worker settings reach the script's psrv.Worker (PSRV_CONFIG, psrv/client/run_settings.py), but its inner
# optimizer: the script steps its own.
_SHIPPED_ONLY = ("job.name", "job.batch_size", "job.eval_every", "faults.")
_INNER = ("worker.inner_optimizer", "worker.inner_lr")
_SCRIPT_ALLREDUCE = ("allreduce.stall_timeout",)  # the all-reduce settings a script's ranks use (the launcher's watch)


@dataclass(frozen=True)
class Script:
    """The script and its arguments; `steps`: --steps as typed (PSRV_STEPS), None when not."""

    path: Path
    args: tuple[str, ...] = ()
    steps: int | None = None

    @property
    def argv(self) -> list[str]:
        return [str(self.path), *self.args]

    @classmethod
    def of(cls, cfg: RunConfig, *, steps_given: bool) -> "Script":
        """The script a config names (job.script); `steps_given`: job.steps was given, so the script gets it."""
        return cls(Path(cfg.job.script), tuple(cfg.job.script_args), cfg.job.steps if steps_given else None)


def with_script(cfg: RunConfig, path: str | Path, args=()) -> RunConfig:
    """`cfg` running the script at `path` (found from the current folder) with `args`, its sha256 taken
    now; ValueError, in one line, where there is no such file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no such file: {path} (a path from the current folder)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return cfg.replace(job=cfg.job.replace(script=str(path), script_args=tuple(str(a) for a in args),
                                           script_sha256=digest))


def check_script_run(cfg: RunConfig, typed: set[str], *, flags: bool = True) -> None:
    """ValueError, in one line, for what a script's run cannot use (`typed`: the dotted keys given, on the
    command line or in a spec; `flags`: name them as options, else as keys)."""
    if cfg.mode == "fsdp":
        raise ValueError(f"{'--mode fsdp: not with --script' if flags else 'mode fsdp: not with a script'}: "
                         "fully_shard would turn the model's parameters into sharded DTensors behind the script's "
                         "back; use ddp or zero1")
    if cfg.cluster.transport != "zmq":
        raise ValueError(f"{'--transport: --script' if flags else 'cluster.transport: a script'}'s workers reach "
                         "the shards over zmq (psrv.Worker's default)")
    script = "--script" if flags else "a script"
    derived = WorkerSettings(local_steps=cfg.worker.local_steps)  # the inner optimizer local_steps alone implies
    for key, f, s in leaves(RunConfig):
        shown = flag_of(key, s) if flags else key
        value, from_file = _get(cfg, key), False
        if flags and key.startswith(("faults.", "worker.")):  # a --config file's, which `typed` does not hold
            from_file = value != (_get(derived, key.removeprefix("worker.")) if key in _INNER else default_of(f))
        if key.startswith(_SHIPPED_ONLY) and (key in typed or from_file):
            raise ValueError(f"{shown}: not used with {script} (the shipped loop's setting; your script decides "
                             "it); remove it")
        if key in _INNER and (key in typed or from_file):
            raise ValueError(f"{shown}: not used with {script} (the shipped loop's inner optimizer; with local "
                             "steps your script steps its own, then calls ps.step()); remove it")
        if key.startswith("worker.") and cfg.is_allreduce and (key in typed or from_file):
            raise ValueError(f"{shown}: not used with {script} in mode {cfg.mode!r} (psrv.Worker all-reduces the "
                             "plain mean gradient, with no shards); remove it")
        if key.startswith("allreduce.") and key not in _SCRIPT_ALLREDUCE and \
                (key in typed or from_file or value != default_of(f)):
            raise ValueError(f"{shown}: not used with {script} (psrv.Worker all-reduces the plain mean gradient); "
                             "remove it")
    check_device(cfg.cluster.device)


def script_from_args(words: list[str], cfg: RunConfig, typed: set[str]) -> tuple[RunConfig, Script]:
    """The run's config and Script of `--script FILE.py ARGS...` (`words`); ValueError, in one line, for an
    option it cannot use (`typed`: the dotted keys given on the command line)."""
    if not words or words[0].startswith("-"):
        raise ValueError("--script: name the script right after it (--script FILE.py ARGS...); psrv's own "
                         "options go before --script")
    try:
        cfg = with_script(cfg, words[0], words[1:])
    except ValueError as exc:
        raise ValueError(f"--script: {exc}") from None
    check_script_run(cfg, typed)
    return cfg, Script.of(cfg, steps_given="job.steps" in typed)


def start_script_workers(cluster: Cluster, cfg: RunConfig, out: Path, script: Script,
                         servers: list[tuple[str, str]], *, metrics: bool, linger: float) -> list[str]:
    """Start the script once per rank, each process named worker-R (its output: DIR/worker-R.log), on host
    servers + R (with emulated hosts: the shards' hosts come first); `servers`: (name, address) of each
    shard, in shard order. In an all-reduce mode there are none, and rank R runs on host R; the ranks meet
    at a rendezvous on rank 0's host (127.0.0.1 without emulated hosts), as the shipped ranks do
    (experiments/launcher/launch_ddp.py)."""
    allreduce = cfg.is_allreduce
    env = script_env(cfg, out, script, None if allreduce else ",".join(a for _, a in servers),
                     metrics=metrics, linger=linger)
    if allreduce:
        env.update(rendezvous_env(cluster, cfg.cluster.workers))
    names = []
    for rank in range(cfg.cluster.workers):
        cluster.start(f"worker-{rank}", [sys.executable, *script.argv],
                      env={**env, "RANK": str(rank), **({"LOCAL_RANK": str(rank)} if allreduce else {})},
                      brief=f"rank {rank} ({script.path})", host=rank if allreduce else cfg.cluster.servers + rank)
        names.append(f"worker-{rank}")
    return names


def script_env(cfg: RunConfig, out: Path | str, script: Script, addresses: str | None, *, metrics: bool = False,
               linger: float = 0.0) -> dict[str, str]:
    """What every rank of a script is given, whichever the launcher or scheduler: all but RANK, with `{rank}`
    in the paths (psrv/client/steplog.py fills it in). `addresses`: the shards' (comma-separated, in shard
    order; an entry may be @FILE, a server's ready file); None in an all-reduce mode. Shared with the
    scheduler's manifests (experiments/launcher/kubernetes.py)."""
    return {"WORLD_SIZE": str(cfg.cluster.workers), "PSRV_SEED": str(cfg.seed), "PSRV_MODE": cfg.mode,
            "PSRV_CONFIG": f"{out}/config.json",
            **({"PSRV_SERVERS": addresses} if addresses is not None else {}),
            "PSRV_RECORD": f"{out}/worker-{{rank}}.json", "PSRV_PROGRESS": f"{out}/worker-{{rank}}.progress",
            "PSRV_PARAMS_OUT": f"{out}/params.pt",  # rank 0 alone writes it
            **({"PSRV_STEPS": str(script.steps)} if script.steps is not None else {}),
            **({"PSRV_BEACON": beacon_path(out)} if cfg.is_allreduce else {}),  # the stall watch's (stall.py)
            # no /metrics from all-reduce ranks: the shipped ones (launch_ddp.py) serve none either
            **({"PSRV_METRICS_PORT": "0", "PSRV_METRICS_LINGER": repr(linger)}
               if metrics and not cfg.is_allreduce else {})}


def check_records(out: Path, workers: int, script: Script, output: Callable[[int], Path]) -> None:
    """RunFailed, in one line, for a rank that exited 0 without writing its record (`output`: where the
    rank's output went)."""
    for rank in range(workers):
        path = out / f"worker-{rank}.json"
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            raise RunFailed(f"rank {rank} ({script.path}) exited 0 without writing {path}: end the loop with "
                            f"ps.close() (or a `with psrv.Worker(...)` block); its output: {output(rank)}")


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg
