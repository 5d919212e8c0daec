"""The sections of the config tree: every setting psrv has, each declared once with its default,
bounds and help, but the optimizer's (OptimConfig and GradClip: psrv/config/optimizer.py), the
worker's (WorkerSettings: psrv/config/worker_settings.py, re-exported here with its names) and the
nemesis's (NemesisSettings, with its schedule's text form: psrv/config/nemesis.py). The process
configs and a run (psrv/config/processes.py) are composed of these."""
from __future__ import annotations

import re
from dataclasses import dataclass

from psrv.config.base import ConfigError, Section, setting
from psrv.config.simulate_settings import CODEC_COSTS, COMPUTE_DISTS, SIM_LEVELS, SimulateSettings  # noqa: F401 (re-exported)
from psrv.config.worker_settings import (INNER_LR, INNER_OPTIMIZERS, OUTER_DTYPES,  # noqa: F401 (re-exported)
                                         WIRE_DTYPES, WorkerSettings)

MODES = ("sync", "async", "ssp")
ALLREDUCE_MODES = ("ddp", "fsdp", "zero1")  # workers/allreduce: DDP, fully_shard, ZeroRedundancyOptimizer
DDP_COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")  # torch.distributed.algorithms.ddp_comm_hooks
RUN_MODES = (*MODES, *ALLREDUCE_MODES)
TRANSPORTS = ("zmq", "rpc")
PLANE_CHOICES = ("auto", "off")  # payload planes beside zmq: psrv/transport/plane.py
SHIPPED_JOBS = ("digits_mlp", "mnist1d_mlp", "synthetic_mlp", "digits_cnn", "digits_mlp3", "mnist1d_cnn",
                "code_lm")  # workers/jobs builds them
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _device(value: str) -> None:
    if value != "cpu" and not (value == "cuda" or value.startswith("cuda:") and value[5:].isdigit()):
        raise ValueError(f"must be cpu, cuda or cuda:K; got {value!r}")


def parse_pair(text: str, *, first: str) -> tuple[float, float]:
    """'A:FACTOR' -> (a, factor), FACTOR >= 1; ValueError with the expected form otherwise."""
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"must look like {first}:FACTOR (e.g. 1:2.0), or '' for none; got {text!r}") from None
    if not b >= 1:
        raise ValueError(f"FACTOR must be >= 1; got {text!r}")
    return a, b


def _straggler(text: str) -> None:
    if text:
        rank, _ = parse_pair(text, first="RANK")
        if rank < 0 or rank != int(rank):
            raise ValueError(f"RANK must be an integer >= 0; got {text!r}")


def _transient(text: str) -> None:
    if text:
        p, _ = parse_pair(text, first="P")
        if not 0 <= p <= 1:
            raise ValueError(f"P must be a probability in [0, 1]; got {text!r}")


def _job(name: str) -> None:
    """A shipped job's name, package.module:factory or path/to/file.py:factory; whether that module
    imports is for the launcher to find out (experiments/launcher/preflight.py), this only checks the form."""
    if ":" not in name:
        if name not in SHIPPED_JOBS:
            raise ValueError(f"unknown job {name!r}; use one of {', '.join(SHIPPED_JOBS)}, "
                             "package.module:factory or path/to/file.py:factory")
        return
    where, _, factory = name.rpartition(":")
    if not factory.isidentifier() or not (where.endswith(".py") or _MODULE.fullmatch(where)):
        raise ValueError(f"must be one of {', '.join(SHIPPED_JOBS)}, package.module:factory or "
                         f"path/to/file.py:factory; got {name!r}")


@dataclass(frozen=True, kw_only=True)
class Placement(Section):
    """Where the tensors live and how processes talk."""

    device: str = setting("cpu", "cpu, cuda or cuda:K", check=_device)
    transport: str = setting("zmq", "how workers reach the servers", choices=TRANSPORTS)
    shared_memory: str = setting("auto", "zmq: a worker and a shard on the same host (and network namespace) "
                                 "move tensors through shared memory, the connection carrying only headers "
                                 "(auto), or everything through the connection (off)", choices=PLANE_CHOICES)
    bulk: str = setting("off", "zmq: tensors between hosts go over a plain TCP connection per worker and shard, "
                        "read with recv_into (auto: where no --curve-keys are given, as it is neither encrypted "
                        "nor authenticated beyond a token: trusted networks only, docs/security.md; it listens on "
                        "a free port of the --bind host), or through zmq (off)", choices=PLANE_CHOICES)


@dataclass(frozen=True, kw_only=True)
class ThreadSettings(Section):
    """This process's share of its host's cores (psrv serve and psrv worker set it: psrv/process.py)."""

    threads: int = setting(0, "torch's threads in this process (torch.set_num_threads); 0: OMP_NUM_THREADS where "
                           "it is set (psrv run sets it: the cores / its processes), else this host's cores / the psrv "
                           "serve and psrv worker processes running on it when this one starts (start a host's "
                           "processes together, or give N); the log says which", minimum=0, metavar="N")


@dataclass(frozen=True, kw_only=True)
class Consistency(Section):
    """When a shard applies a push and answers a pull (the servers hold it)."""

    mode: str = setting("ssp", "sync (BSP), async (ASP), ssp, or an all-reduce baseline (psrv run only): ddp, "
                        "fsdp (fully_shard) or zero1 (ZeroRedundancyOptimizer over DDP)", choices=RUN_MODES)
    staleness: int = setting(2, "SSP bound s: no worker runs more than s clocks ahead of the slowest",
                             minimum=0)
    backup_workers: int = setting(0, "sync: apply a clock once N-b gradients are in", minimum=0)
    quorum: int = setting(0, "sync: merge once Q distinct workers' pushes of any clock are in (Decoupled DiLoCo's "
                          "minimum quorum), answering every pull at once, so no worker waits for the slowest; a "
                          "faster worker's second push joins the same merge; with --fragments each fragment merges "
                          "on its own Q (0: the barrier)", minimum=0, metavar="Q")
    quorum_max_age: int = setting(0, "with --quorum: drop a push computed on weights more than A merges old as late "
                                  "(0: every push joins the open merge)", minimum=0, metavar="A")
    quorum_grace: float = setting(0.0, "with --quorum: once Q workers are in, hold the merge open up to SECONDS for the "
                                  "others' pushes (judged as each request arrives, so replicated shards close it "
                                  "alike; 0: merge at the Q-th)", minimum=0.0, metavar="SECONDS")
    quorum_grace_adaptive: bool = setting(False, "with --quorum-grace: end the window early, at the Q-th push "
                                          "already, unless a worker outside the merge is expected to push before "
                                          "one inside pushes again (each worker's next push expected from its mean "
                                          "interval between pushes); then hold it until that re-push is due, at most "
                                          "--quorum-grace seconds")
    quorum_wait: bool = setting(False, "with --quorum: a push on the latest merge's weights waits for its merge to "
                                "close before its pull is answered, so the worker's next round starts from weights "
                                "with its own push in them; a push on older weights (a slower worker's) is answered "
                                "at once: workers wait for the Q-th push, never for the slowest")

    def validate(self) -> None:
        super().validate()
        if self.backup_workers and self.mode != "sync":
            raise ConfigError("backup_workers", f"applies to mode 'sync' only (mode is {self.mode!r})")
        if self.quorum and self.mode != "sync":
            raise ConfigError("quorum", f"is a setting of mode 'sync' (mode is {self.mode!r})")
        if self.quorum and self.backup_workers:
            raise ConfigError("quorum", "replaces backup_workers (a quorum of N-b is backup workers without the "
                              "barrier): give one of them")
        if self.quorum_max_age and not self.quorum:
            raise ConfigError("quorum_max_age", "applies with quorum only (the barrier's pushes are all fresh)")
        if self.quorum_grace and not self.quorum:
            raise ConfigError("quorum_grace", "applies with quorum only (the barrier waits for every worker)")
        if self.quorum_grace_adaptive and not self.quorum_grace:
            raise ConfigError("quorum_grace_adaptive", "adapts the grace window: give --quorum-grace SECONDS, its "
                              "longest")
        if self.quorum_wait and not self.quorum:
            raise ConfigError("quorum_wait", "applies with quorum only (the barrier's pulls all wait)")
        if self.quorum_wait and self.quorum_grace:
            raise ConfigError("quorum_wait", "cannot hold pulls under --quorum-grace: a window closes at a request, "
                              "and the workers held for it would send none")


@dataclass(frozen=True, kw_only=True)
class AllReduceSettings(Section):
    """How the all-reduce baselines (mode ddp, fsdp, zero1) reduce gradients and time their steps."""

    ddp_comm_hook: str = setting("none", "DDP's communication hook (mode ddp and zero1): none (the mean), fp16, "
                                 "bf16 (half-precision all-reduce) or powersgd (low-rank, error feedback)",
                                 choices=DDP_COMM_HOOKS)
    powersgd_rank: int = setting(1, "the rank of PowerSGD's approximation (--ddp-comm-hook powersgd)", minimum=1)
    wait_barrier: bool = setting(False, "time the wait for the slowest rank in a barrier before the gradient "
                                 "collective (one more small collective per step; default: estimated after the "
                                 "run as each step's time in the collective beyond the fastest rank's)")
    stall_timeout: float = setting(0.0, "psrv run ends an all-reduce run (ddp, fsdp, zero1) once a rank has made "
                                   "no step for this many seconds, in one line naming the rank and the collective "
                                   "it is in, and stops every rank (0: 5x the slowest step so far, at least 10 s and "
                                   "at most 60 s, and 60 s before the first step; an evaluation pauses it)",
                                   minimum=0.0, metavar="SECONDS")

    def validate(self) -> None:
        super().validate()
        if self.powersgd_rank != 1 and self.ddp_comm_hook != "powersgd":
            raise ConfigError("powersgd_rank", f"only used by ddp_comm_hook powersgd (it is "
                              f"{self.ddp_comm_hook!r}); remove it")


@dataclass(frozen=True, kw_only=True)
class Seeded(Section):
    """Reproducibility: one seed for the model, the data order and the faults."""

    seed: int = setting(0, "seeds the model, the data order and the faults", minimum=0)


@dataclass(frozen=True, kw_only=True)
class Trackers(Section):
    """Where a run's results also go, for the trackers researchers already use (experiments/harness/tracking.py)."""

    tensorboard: str = setting("", "also write TensorBoard event files under DIR when the run ends: one run per "
                               "variant and seed, with the scalars of steps.csv and evals.csv and the servers' "
                               "staleness histograms (empty: none)", metavar="DIR")
    mlflow: str = setting("", "also log the run to the MLflow tracking store at URI when it ends (a local "
                          "sqlite:///runs/mlflow.db, or a server's http://HOST:5000; needs `pip install "
                          "psrv[mlflow]`): its config as params, steps.csv and evals.csv as metrics per step, "
                          "summary.json's numbers, summary.json and config.json as artifacts (empty: none)",
                          metavar="URI")


@dataclass(frozen=True, kw_only=True)
class FaultConfig(Section):
    """Deterministic, seeded disturbances injected by the worker (workers/faults.py)."""

    compute_ms: float = setting(0.0, "extra emulated compute per step, ms", minimum=0.0)
    straggler: str = setting("", "a persistently slow worker", check=_straggler, metavar="RANK:FACTOR")
    transient_stragglers: str = setting("", "each step is FACTOR x slower with probability P",
                                        check=_transient, metavar="P:FACTOR")
    net_delay_ms: float = setting(0.0, "user-space delay before each send, ms", minimum=0.0)

    def straggler_pair(self) -> tuple[int, float] | None:
        if not self.straggler:
            return None
        rank, factor = parse_pair(self.straggler, first="RANK")
        return int(rank), factor

    def transient_pair(self) -> tuple[float, float] | None:
        return parse_pair(self.transient_stragglers, first="P") if self.transient_stragglers else None


def parse_kill(text: str, *, first: str) -> tuple[int, int] | None:
    """'INDEX:STEP' -> (index, step), both integers (STEP >= 1); None for ''; ValueError naming the form."""
    if not text:
        return None
    try:
        index, step = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"must look like {first}:STEP (e.g. 1:100), or '' for none; got {text!r}") from None
    if index < 0 or step < 1:
        raise ValueError(f"{first} must be >= 0 and STEP >= 1; got {text!r}")
    return index, step


def _kill_server(text: str) -> None:
    parse_kill(text, first="SHARD")


def _kill_worker(text: str) -> None:
    parse_kill(text, first="RANK")


@dataclass(frozen=True, kw_only=True)
class KillSettings(Section):
    """Processes psrv run kills on purpose, for fault experiments (experiments/launcher/kills.py)."""

    server: str = setting("", "SIGKILL shard SHARD's server once worker 0 has done STEP steps (seen within 10 "
                          "steps: the workers' progress files); with --replicas its backup takes over, with "
                          "--checkpoint-every it is restarted from its checkpoint, with neither the run ends", flag="kill-server", metavar="SHARD:STEP",
                          check=_kill_server)
    worker: str = setting("", "SIGKILL rank RANK's worker once worker 0 has done STEP steps; the others go on "
                          "without it after --worker-timeout; with --restart-workers it comes back, else the summary "
                          "counts the steps it did not write (rank 0, which writes the final weights, only with "
                          "--restart-workers)", flag="kill-worker", metavar="RANK:STEP",
                          check=_kill_worker)


@dataclass(frozen=True, kw_only=True)
class RecoverySettings(Section):
    """How psrv run survives a shard's death without replicas (docs/reliability.md)."""

    every: float = setting(0.0, "every shard writes a checkpoint into DIR/checkpoints every SECONDS; a shard that "
                           "dies is restarted from it with --resume on its address, and the summary counts the "
                           "clocks lost (0: no checkpoints; a dead shard ends the run)", minimum=0.0,
                           flag="checkpoint-every", metavar="SECONDS")


@dataclass(frozen=True, kw_only=True)
class RestartSettings(Section):
    """How psrv run brings back a worker that died (experiments/launcher/worker_restarts.py, docs/reliability.md)."""

    workers: int = setting(0, "restart a worker that dies (--kill-worker, a crash, a kill from outside) with its "
                           "rank, at most N times per rank; it rejoins at the shards' clock and runs to the run's end "
                           "(0: a worker killed on purpose is left behind, any other death ends the run)",
                           minimum=0, flag="restart-workers", metavar="N")


@dataclass(frozen=True, kw_only=True)
class JobConfig(Section):
    """What to train: a job (workers/jobs) and how long."""

    name: str = setting("digits_mlp", "digits_mlp, mnist1d_mlp, synthetic_mlp, package.module:factory or "
                        "path/to/file.py:factory (both found from the current folder)", flag="job", check=_job)
    steps: int = setting(300, "steps per worker (inner steps with local_steps)", minimum=1)
    batch_size: int = setting(32, "per-worker batch", minimum=1)
    eval_every: int = setting(0, "rank 0 evaluates every K steps (0: at the start and the end only)", minimum=0)
    script: str = setting("", "a psrv.Worker script every worker runs in place of the job (a path found from the "
                          "current folder); `psrv run --script FILE` and a spec's [job] script set it", flag="")
    script_args: tuple[str, ...] = setting((), "the script's arguments", flag="")
    script_sha256: str = setting("", "the script's sha256, computed when the run is configured (not given): a "
                                 "changed script is another config, so a finished run of the old one is not reused",
                                 flag="")


@dataclass(frozen=True, kw_only=True)
class ServerSettings(Section):
    """How a shard treats its workers and their messages."""

    worker_timeout: float = setting(10.0, "seconds of silence before a worker leaves the active set",
                                    minimum=0.1)
    failure_bound: float = setting(1.0, "seconds of silence after which a replica of a shard counts as failed; "
                                   "every failover timeout derives from it (psrv/timeouts.py): the primary pings its "
                                   "backups every bound/10, a backup takes over after bound/2 without a word, a "
                                   "primary drops a backup that has not acknowledged for one bound (at once if its process ended), a worker probes a "
                                   "silent replicated shard after bound/5 and tries its next replica after 3 x "
                                   "bound/5; must stay below --worker-timeout / 2", minimum=0.05, metavar="SECONDS")
    join_timeout: float = setting(120.0, "seconds a shard waits for a worker it has never heard from (its first "
                                  "HELLO) before it goes on without it: a sync barrier waits this long for a rank "
                                  "that never starts; a HELLO later brings it back", minimum=0.1, metavar="SECONDS")
    max_message_bytes: int = setting(1 << 31, "drop (and disconnect) any bigger message before it is read",
                                     minimum=1)
    nonfinite: str = setting("reject", "a gradient with NaN/Inf is answered with ERROR (reject) or "
                             "acknowledged and not applied (skip); both are counted", choices=("reject", "skip"))


@dataclass(frozen=True, kw_only=True)
class ServeSettings(Section):
    """A shard started by hand (psrv serve): checkpoints and CURVE (docs/reliability.md, docs/security.md)."""

    checkpoint_dir: str = setting("", "write this shard's checkpoint here (atomically) every --checkpoint-every "
                                  "seconds, on CHECKPOINT, on SIGTERM and at exit", metavar="DIR")
    checkpoint_every: float = setting(0.0, "seconds between checkpoints; 0: only at exit and on CHECKPOINT",
                                      minimum=0.0, metavar="SECONDS")
    resume: bool = setting(False, "restore the shard from --checkpoint-dir first")
    backup_of: str = setting("", "serve as a backup of the shard served at ADDRESS (tcp://HOST:PORT, with "
                             "transport rpc rpc://HOST:PORT/server-K around this server's --rpc-master, or @FILE: "
                             "read from that server's --ready-file; several, comma-separated: the shard's replicas, "
                             "whichever is its primary): it takes the shard's state, then applies the same pushes "
                             "in the same order, and takes over when that primary falls silent "
                             "(docs/reliability.md)", metavar="ADDRESS")
    witness: str = setting("", "a replicated shard's witness: a directory its primary and every backup reach (on "
                           "several hosts, a shared filesystem), where each change of the shard's epoch is claimed "
                           "(one file per epoch; docs/reliability.md); needed with --backup-of, and by the primary "
                           "a backup joins (psrv run --replicas gives DIR/witness)", metavar="DIR")
    curve_keys: str = setting("", "CURVE encryption, and admit only the clients whose public key is in DIR "
                              "(made by psrv keygen); enables CHECKPOINT and SHUTDOWN", metavar="DIR")
    rpc_backups: int = setting(0, "transport rpc only: the backups per shard (psrv serve --backup-of; psrv run "
                               "--replicas) in the job's RPC world, which is fixed when it forms; every server of the "
                               "job says the same number (workers and backups read it at the rendezvous)", minimum=0,
                               metavar="R")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig(Placement):
    """How many processes of each kind a run starts."""

    servers: int = setting(2, "server shards", minimum=1)
    workers: int = setting(2, "workers", minimum=1)
    replicas: int = setting(0, "backups per shard (psrv serve --backup-of): a push is acknowledged once every "
                            "live backup holds it, and when a shard's primary dies a backup takes over with "
                            "nothing lost (docs/reliability.md)", minimum=0)


def _rate(value: str) -> None:
    if value and not re.fullmatch(r"[1-9][0-9]*(kbit|mbit|gbit)", value):
        raise ValueError(f"must look like 200mbit or 1gbit (kbit, mbit, gbit); got {value!r}")


@dataclass(frozen=True, kw_only=True)
class NetworkSettings(Section):
    """The network a local run's processes talk over (experiments/launcher/netns.py)."""

    bandwidth: str = setting("", "run each process on an emulated host of its own (a network namespace, "
                             "deploy/netns/cluster.sh) with its egress capped at RATE, e.g. 200mbit; needs "
                             "root; '' : all on 127.0.0.1, uncapped", check=_rate, metavar="RATE")
