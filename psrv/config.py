"""Typed configs for servers, workers and local runs, validated in __post_init__ (ValueError)."""
from __future__ import annotations

from dataclasses import dataclass, field

MODES = ("sync", "async", "ssp")
RUN_MODES = (*MODES, "ddp")
OPTIMIZERS = ("sgd", "adam", "adamw")
TRANSPORTS = ("zmq", "rpc")
WIRE_DTYPES = ("float32", "bfloat16", "float16")  # what a worker may send its gradient as


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _at_least(name: str, value: float, low: float) -> None:
    if value < low:
        raise ValueError(f"{name} must be >= {low}; got {value}")


def _device(name: str, value: str) -> None:
    if value != "cpu" and not value.startswith("cuda"):
        raise ValueError(f"{name} must be 'cpu' or 'cuda[:K]'; got {value!r}")


@dataclass(frozen=True)
class OptimConfig:
    """Server-side optimizer; the names and defaults follow torch.optim."""

    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        _choice("optimizer", self.name, OPTIMIZERS)
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0; got {self.lr}")
        _at_least("momentum", self.momentum, 0.0)
        _at_least("weight_decay", self.weight_decay, 0.0)
        if self.nesterov and (self.name != "sgd" or self.momentum == 0):
            raise ValueError("nesterov needs --optimizer sgd with --momentum > 0")


@dataclass(frozen=True)
class ServerConfig:
    shard: int = 0
    num_shards: int = 1
    workers: int = 1
    bind: str = "tcp://127.0.0.1:0"
    mode: str = "ssp"
    staleness: int = 2
    backup_workers: int = 0
    optim: OptimConfig = field(default_factory=OptimConfig)
    device: str = "cpu"
    transport: str = "zmq"
    worker_timeout: float = 10.0
    max_message_bytes: int = 1 << 31
    nonfinite: str = "reject"
    checkpoint_dir: str = ""        # psrv/checkpoint.py; empty: no checkpoints
    checkpoint_every: float = 0.0   # seconds between checkpoints; 0: only at exit (and on CHECKPOINT)
    resume: bool = False            # restore this shard from checkpoint_dir at start
    curve_keys: str = ""            # a `psrv keygen` directory: CURVE encryption + worker allow-list

    def __post_init__(self) -> None:
        _choice("mode", self.mode, MODES)
        _choice("transport", self.transport, TRANSPORTS)
        _choice("nonfinite", self.nonfinite, ("reject", "skip"))
        _at_least("checkpoint_every", self.checkpoint_every, 0.0)
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir (where the checkpoints are)")
        if self.curve_keys and self.transport != "zmq":
            raise ValueError("--curve-keys needs --transport zmq (torch RPC has no authentication)")
        _device("device", self.device)
        _at_least("num_shards", self.num_shards, 1)
        _at_least("workers", self.workers, 1)
        _at_least("staleness", self.staleness, 0)
        _at_least("worker_timeout", self.worker_timeout, 0.1)
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(f"shard must be in [0, {self.num_shards}); got {self.shard}")
        if not 0 <= self.backup_workers < self.workers:
            raise ValueError(f"backup_workers must be in [0, workers={self.workers}); got {self.backup_workers}")
        if self.backup_workers and self.mode != "sync":
            raise ValueError("backup_workers applies to --mode sync only")


@dataclass(frozen=True)
class FaultConfig:
    """Deterministic, seeded disturbances injected by the worker (workers/faults.py)."""

    compute_ms: float = 0.0
    straggler: str = ""             # "RANK:FACTOR": a persistently slow worker
    transient_stragglers: str = ""  # "P:FACTOR": each step is FACTOR x slower with probability P
    net_delay_ms: float = 0.0

    def __post_init__(self) -> None:
        _at_least("compute_ms", self.compute_ms, 0.0)
        _at_least("net_delay_ms", self.net_delay_ms, 0.0)
        for name, text in (("straggler", self.straggler), ("transient_stragglers", self.transient_stragglers)):
            if text:
                parse_pair(name, text)

    def straggler_pair(self) -> tuple[int, float] | None:
        if not self.straggler:
            return None
        rank, factor = parse_pair("straggler", self.straggler)
        return int(rank), factor

    def transient_pair(self) -> tuple[float, float] | None:
        if not self.transient_stragglers:
            return None
        p, factor = parse_pair("transient_stragglers", self.transient_stragglers)
        if not 0 <= p <= 1:
            raise ValueError(f"transient_stragglers probability must be in [0, 1]; got {p}")
        return p, factor


def parse_pair(name: str, text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"{name} must look like A:FACTOR (e.g. 1:2.0); got {text!r}") from None
    if b < 1:
        raise ValueError(f"{name} factor must be >= 1; got {b}")
    return a, b


@dataclass(frozen=True)
class WorkerConfig:
    servers: tuple[str, ...] = ()
    rank: int = 0
    world_size: int = 1
    job: str = "digits_mlp"
    steps: int = 300
    batch_size: int = 32
    seed: int = 0
    device: str = "cpu"
    transport: str = "zmq"
    eval_every: int = 0            # 0: evaluate only at the start and the end
    request_timeout: float = 60.0  # seconds without any reply before the client gives up
    curve_keys: str = ""           # a `psrv keygen` directory holding server.key and worker-RANK.key_secret
    wire_dtype: str = "float32"    # the gradient's dtype on the wire; the servers apply it in float32
    overlap: bool = True           # with >1 shard, push each shard's slice as soon as backward finishes it
    faults: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("servers must name at least one shard address (tcp://host:port)")
        _choice("transport", self.transport, TRANSPORTS)
        _choice("wire_dtype", self.wire_dtype, WIRE_DTYPES)
        if any(a.startswith("rpc://") for a in self.servers) != (self.transport == "rpc"):
            raise ValueError("rpc://HOST:PORT/server-<i> addresses go with --transport rpc, tcp:// ones with zmq")
        _device("device", self.device)
        _at_least("world_size", self.world_size, 1)
        _at_least("steps", self.steps, 1)
        _at_least("batch_size", self.batch_size, 1)
        _at_least("eval_every", self.eval_every, 0)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}); got {self.rank}")
