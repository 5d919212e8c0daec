"""The sections of the config tree: every setting psrv has, each declared once with its default,
bounds and help, but the optimizer's (OptimConfig and GradClip: psrv/config/optimizer.py). The process
configs and a run (psrv/config/processes.py) are composed of these."""
from __future__ import annotations

import re
from dataclasses import dataclass

from psrv.codec_names import LOSSY_NAMES
from psrv.config.base import ConfigError, Section, setting
from psrv.local_period import AUTO_DEFAULT, base_steps, is_dynamic, parse_local_steps

MODES = ("sync", "async", "ssp")
ALLREDUCE_MODES = ("ddp", "fsdp", "zero1")  # workers/allreduce: DDP, fully_shard, ZeroRedundancyOptimizer
DDP_COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")  # torch.distributed.algorithms.ddp_comm_hooks
RUN_MODES = (*MODES, *ALLREDUCE_MODES)
TRANSPORTS = ("zmq", "rpc")
PLANE_CHOICES = ("auto", "off")  # payload planes beside zmq: psrv/transport/plane.py
WIRE_DTYPES = ("float32", "bfloat16", "float16")  # what a worker may send its gradient as
INNER_OPTIMIZERS = ("sgd", "adamw")  # a worker's own, for local steps (torch.optim.SGD, AdamW)
INNER_LR = {"sgd": 0.05, "adamw": 0.001}  # inner_lr's default with each
OUTER_DTYPES = ("float32", "bfloat16", "int8", "fp4")  # local steps: the pseudo-gradient on the wire
SHIPPED_JOBS = ("digits_mlp", "mnist1d_mlp", "synthetic_mlp", "digits_cnn", "mnist1d_cnn",
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


def _compress(spec: str) -> None:
    if spec:
        from psrv.codec_names import parse  # the codecs' names, without torch
        parse(spec)


def _job(name: str) -> None:
    """A shipped job's name, package.module:factory or path/to/file.py:factory; whether that module
    imports is for the launcher to find out (experiments/preflight.py), this only checks the form."""
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
class Consistency(Section):
    """When a shard applies a push and answers a pull (the servers hold it)."""

    mode: str = setting("ssp", "sync (BSP), async (ASP), ssp, or an all-reduce baseline (psrv run only): ddp, "
                        "fsdp (fully_shard) or zero1 (ZeroRedundancyOptimizer over DDP)", choices=RUN_MODES)
    staleness: int = setting(2, "SSP bound s: no worker runs more than s clocks ahead of the slowest",
                             minimum=0)
    backup_workers: int = setting(0, "sync: apply a clock once N-b gradients are in", minimum=0)

    def validate(self) -> None:
        super().validate()
        if self.backup_workers and self.mode != "sync":
            raise ConfigError("backup_workers", f"applies to mode 'sync' only (mode is {self.mode!r})")


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
    """Where a run's results also go, for the trackers researchers already use (experiments/tracking.py)."""

    tensorboard: str = setting("", "also write TensorBoard event files under DIR when the run ends: one run per "
                               "variant and seed, with the scalars of steps.csv and evals.csv and the servers' "
                               "staleness histograms (empty: none)", metavar="DIR")


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
    """Processes psrv run kills on purpose, for fault experiments (experiments/kills.py)."""

    server: str = setting("", "SIGKILL shard SHARD's server once worker 0 has done STEP steps (seen within 10 "
                          "steps: the workers' progress files); with --replicas its backup takes over, with "
                          "--checkpoint-every it is restarted from its checkpoint, with neither the run ends", flag="kill-server", metavar="SHARD:STEP",
                          check=_kill_server)
    worker: str = setting("", "SIGKILL rank RANK's worker (not rank 0, which writes the final weights) once worker "
                          "0 has done STEP steps; the others go on without it after --worker-timeout, and the "
                          "summary counts the steps it did not write", flag="kill-worker", metavar="RANK:STEP",
                          check=_kill_worker)


@dataclass(frozen=True, kw_only=True)
class RecoverySettings(Section):
    """How psrv run survives a shard's death without replicas (docs/reliability.md)."""

    every: float = setting(0.0, "every shard writes a checkpoint into DIR/checkpoints every SECONDS; a shard that "
                           "dies is restarted from it with --resume on its address, and the summary counts the "
                           "clocks lost (0: no checkpoints; a dead shard ends the run)", minimum=0.0,
                           flag="checkpoint-every", metavar="SECONDS")


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
    curve_keys: str = setting("", "CURVE encryption, and admit only the clients whose public key is in DIR "
                              "(made by psrv keygen); enables CHECKPOINT and SHUTDOWN", metavar="DIR")
    rpc_backups: int = setting(0, "transport rpc only: the backups per shard (psrv serve --backup-of; psrv run "
                               "--replicas) in the job's RPC world, which is fixed when it forms; every server of the "
                               "job says the same number (workers and backups read it at the rendezvous)", minimum=0,
                               metavar="R")


@dataclass(frozen=True, kw_only=True)
class WorkerSettings(Section):
    """How a worker pushes and waits."""

    wire_dtype: str = setting("float32", "send gradients as this dtype (bfloat16/float16 halve the push; the "
                              "servers apply them in float32)", choices=WIRE_DTYPES)
    overlap: bool = setting(True, "with several shards, push only after backward ends (default: each "
                            "shard's slice goes out as soon as backward finishes it)", flag="no-overlap")
    request_timeout: float = setting(60.0, "seconds without any reply before a worker gives up",
                                     minimum=0.1)
    compress: str = setting("", "push codec (psrv/codecs, docs/compression.md): topk:RATIO, randomk:RATIO, sign, "
                            "int8, fp4, or float16/bfloat16 (as --wire-dtype); '' : dense float32 (under --optimizer onebit_adam: "
                            "the momentum's codec after the freeze, '' : sign)", check=_compress,
                            metavar="CODEC")
    error_feedback: bool = setting(True, "turn off the error feedback of a lossy --compress (default: each "
                                   "worker adds what its last pushes left out to the next)", flag="no-error-feedback")
    momentum_correction: bool = setting(True, "turn off momentum correction (default: with a lossy --compress, "
                                        "its error feedback and SGD momentum on the servers, each worker keeps the "
                                        "velocity, pushes it compressed with error feedback and the servers step it "
                                        "without momentum of their own: Lin et al. 2018, DGC; docs/compression.md)",
                                        flag="no-momentum-correction")
    compress_warmup: int = setting(50, "the warm-up training of Deep Gradient Compression (Lin et al. 2018, ICLR): "
                                   "over the first N pushes top-k's and random-k's ratio rises to RATIO in four stages "
                                   "of N/4 pushes, stage s sending RATIO^((s+1)/5) (as DGC's code computes its warm-up "
                                   "epochs' ratios: 75%, 93.75%, 98.4%, 99.6% sparsity before 99.9%); 0: RATIO from the "
                                   "first push; docs/compression.md", minimum=0, metavar="N")
    momentum_masking: bool = setting(False, "with momentum correction and top-k or random-k, zero the velocity where "
                                     "a push sent (DGC's momentum factor masking, Lin et al. 2018; off by default: "
                                     "with the warm-up it left digits_mlp further from dense, docs/compression.md)")
    sign_scale: str = setting("auto", "the scale of each chunk of --compress sign: l2, its root mean square (1-bit "
                              "Adam's, Tang et al. 2021, as DeepSpeed computes it), or l1, its mean |x| "
                              "(EF-SignSGD's, Karimireddy et al. 2019). auto: l2, but l1 for onebit_adam's momenta "
                              "(its step divides by the frozen variance, and l2's larger steps on weights of small "
                              "variance diverged a digits_mlp run). l2 because with l1 a chunk's few large elements "
                              "kept most of their value waiting in the residual for tens of pushes and a digits_mlp "
                              "run came apart late (docs/compression.md)", choices=("auto", "l2", "l1"))
    compress_min_numel: int = setting(1024, "with --compress, tensors of fewer elements (biases, norms) are "
                                      "pushed dense", minimum=0, metavar="N")
    compress_pull: str = setting("", "pull codec (the same names as --compress; docs/compression.md): each shard sends "
                                 "the compressed change of its weights since this worker's copy (with --fragments, of the "
                                 "fragment's weights), keeping the residual per worker (one float32 copy of the shard "
                                 "each), so the copy drifts from the weights by that residual only; tensors under "
                                 "--compress-min-numel travel exactly. '' : dense pulls", check=_compress, metavar="CODEC")
    pull_error_feedback: bool = setting(True, "turn off the shards' error feedback of --compress-pull (default: "
                                        "what a pull left out rides with the next; off: it is lost until a resync)",
                                        flag="no-pull-error-feedback")
    pull_resync: int = setting(100, "with --compress-pull, one pull in N is dense and resets the copy to the "
                               "shard's weights (0: only on a reconnect, a re-HELLO or a restarted shard, which "
                               "always resync; the final pull is dense too)", minimum=0, metavar="N")
    push_chunk_mb: float = setting(8.0, "a dense push bigger than this many MB goes in chunks that an async or ssp "
                                   "shard applies as they arrive, so it holds one chunk, not the push, in memory "
                                   "(0: pushes go whole; sync and some update rules take them whole anyway; "
                                   "docs/architecture.md)", minimum=0.0, metavar="MB")
    local_steps: int | str = setting(1, "local SGD / DiLoCo: inner steps per push; each push is the "
                                     "pseudo-gradient w_pulled - w_now and the servers' optimizer is the outer one "
                                     "(1: push every step). auto[:H]: dynamic local updates, the fastest worker "
                                     f"takes H (default {AUTO_DEFAULT}) and each other fewer, by its measured "
                                     "speed, so all push at about the same rate; docs/algorithms.md",
                                     check=parse_local_steps, metavar="H|auto[:H]")
    inner_optimizer: str | None = setting(None, "the worker's own optimizer for its inner steps (default: adamw "
                                          "when local_steps > 1, none at 1: push the gradient); given at "
                                          "local_steps 1, every step pushes its update", choices=INNER_OPTIMIZERS)
    inner_lr: float | None = setting(None, f"the inner optimizer's learning rate (default: {INNER_LR['adamw']} "
                                     f"with adamw, {INNER_LR['sgd']} with sgd)", minimum=0.0, above=True)
    fragments: int = setting(1, "streaming DiLoCo (Douillard et al. 2025): with --local-steps H, the parameter "
                             "tensors split into F strided fragments (fragment f: tensors f, f+F, f+2F, ... in the "
                             "model's order) and one fragment is pushed every H/F inner steps, in turn, so each is "
                             "synced once per H steps; its answer is merged one inner step later, mixed half and "
                             "half with the local weights, while the worker computes; --compress-pull compresses "
                             "each fragment's answer (1: plain DiLoCo, the whole model every H steps; "
                             "docs/compression.md, \"Streaming DiLoCo\")", minimum=1,
                             metavar="F")
    outer_dtype: str = setting("float32", "the pushed pseudo-gradients (outer gradients) on the wire: bfloat16, or "
                               "int8 / fp4 (a 4-bit integer, two per byte) with a float32 scale per 1024 elements "
                               "and no error feedback; the servers dequantise and average them in float32; needs "
                               "--local-steps > 1", choices=OUTER_DTYPES)

    @property
    def local_updates(self) -> bool:
        """True when this worker steps its own inner optimizer and pushes pseudo-gradients."""
        return self.inner_optimizer is not None

    @property
    def local_steps_base(self) -> int:
        """H: the inner steps per push, or the fastest worker's under 'auto:H'."""
        return base_steps(self.local_steps)

    def validate(self) -> None:
        super().validate()
        if self.compress.partition(":")[0] in LOSSY_NAMES and self.wire_dtype != "float32":
            raise ConfigError("wire_dtype", f"is another push codec; compress {self.compress!r} sends float32 values")
        if self.inner_optimizer is None and (self.local_steps_base > 1 or is_dynamic(self.local_steps)):
            object.__setattr__(self, "inner_optimizer", "adamw")
        if self.inner_optimizer is None:
            if self.inner_lr is not None:
                raise ConfigError("inner_lr", "needs local_steps > 1 or an inner_optimizer; remove it")
        elif self.inner_lr is None:
            object.__setattr__(self, "inner_lr", INNER_LR[self.inner_optimizer])
        self._check_streaming()

    def _check_streaming(self) -> None:
        """fragments and outer_dtype: local steps > 1 (fixed H, which F divides), and no other push codec."""
        local = self.local_steps_base > 1 and self.inner_optimizer is not None
        if self.outer_dtype != "float32":
            if not local:
                raise ConfigError("outer_dtype", "quantises the pseudo-gradients of local steps; needs local_steps > 1")
            if self.compress or self.wire_dtype != "float32":
                raise ConfigError("outer_dtype", "is the push codec of local steps; remove compress and wire_dtype")
        if self.fragments == 1:
            return
        if not local:
            raise ConfigError("fragments", "splits the pushes of local steps; needs local_steps > 1")
        if is_dynamic(self.local_steps):
            raise ConfigError("fragments", f"needs a fixed local_steps H, not {self.local_steps!r}")
        if self.local_steps_base % self.fragments:
            raise ConfigError("fragments", f"{self.fragments} must divide local_steps {self.local_steps_base} "
                              "(one fragment every H/F inner steps)")
        if self.compress or self.wire_dtype != "float32":
            raise ConfigError("fragments", "pushes with outer_dtype; remove compress and wire_dtype")


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
    """The network a local run's processes talk over (experiments/netns.py)."""

    bandwidth: str = setting("", "run each process on an emulated host of its own (a network namespace, "
                             "deploy/netns/cluster.sh) with its egress capped at RATE, e.g. 200mbit; needs "
                             "root; '' : all on 127.0.0.1, uncapped", check=_rate, metavar="RATE")


SIM_LEVELS = ("timing", "learning")
COMPUTE_DISTS = ("constant", "lognormal", "steps.csv")
CODEC_COSTS = ("measured", "off")  # experiments/simulate/codec_cost.py


@dataclass(frozen=True, kw_only=True)
class SimulateSettings(Section):
    """psrv simulate: the discrete-event simulator's models (experiments/simulate, docs/simulator.md)."""

    level: str = setting("timing", "timing: throughput, waits, staleness and clock gaps only; learning: also "
                         "the job's real gradients, applied in the simulated order", choices=SIM_LEVELS)
    compute: str = setting("constant", "a step's compute time before stragglers: constant (model_ms + compute_ms), "
                           "lognormal (that times exp(sigma*Z), Z standard normal) or steps.csv (a step of the real "
                           "run --compute-csv names, its own stragglers taken out; that run's compute_ms must be "
                           "this one's)", choices=COMPUTE_DISTS)
    model_ms: float = setting(1.0, "the job's own compute per step, ms, to which --compute-ms is added",
                              minimum=0.0)
    sigma: float = setting(0.5, "lognormal's sigma", minimum=0.0, flag="lognormal-sigma")
    compute_csv: str = setting("", "a real run's steps.csv (its config.json beside it), for --compute steps.csv",
                               metavar="FILE")
    latency_ms: float = setting(0.1, "one-way latency of every message, ms", minimum=0.0)
    bandwidth_gbps: float = setting(10.0, "bandwidth of every link, Gbit/s: a worker's own, and each server's, "
                                    "shared by all its workers' messages", minimum=0.0, above=True)
    server_ms: float = setting(0.0, "a shard's time to handle one push (one at a time), ms", minimum=0.0)
    codec_cost: str = setting("measured", "the codecs' CPU time (compressed pushes and pulls, streaming DiLoCo's "
                              "outer dtype): measured (each encode and decode timed once on this machine with the "
                              "real codecs at the shard's size, charged to the worker or shard that does it, in "
                              "turn) or off (the bytes alone)", choices=CODEC_COSTS)
    sample_workers: int = setting(8, "the first K workers' every step goes into steps.csv", minimum=1,
                                  metavar="K")

    def validate(self) -> None:
        super().validate()
        if (self.compute == "steps.csv") != bool(self.compute_csv):
            raise ConfigError("compute_csv", "goes with compute 'steps.csv', and it needs one")
