"""What each process is given, composed from the sections: a shard (`psrv serve`), a worker
(`psrv worker`) and a whole run (`psrv run`, one run of a spec, the all-reduce baseline).

A run derives every process's config (`RunConfig.server_config`, `RunConfig.worker_config`), and a
launched process receives it whole as JSON (`--config FILE`), so no setting is described twice.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from psrv.codec_names import CASTS
from psrv.config.address_form import address_problem, check_shard_addresses
from psrv.config.base import ConfigError, Section, section, setting
from psrv.config.codec_knobs import corrects, run_knobs
from psrv.config.hierarchy import HierarchySettings, UpstreamSettings, check_hierarchy, check_upstream
from psrv.config.in_place import check_in_place_run
from psrv.config.nemesis import NemesisSettings, check_nemesis
from psrv.config.optimizer import STALENESS_RULES, VELOCITY_RULES, GradClip, OptimConfig
from psrv.config.worker_settings import extrapolate_in_run
from psrv.timeouts import Timeouts
from psrv.config.sections import (MODES, AllReduceSettings, ClusterConfig, Consistency, FaultConfig, JobConfig,
                                  KillSettings, NetworkSettings, Placement, RecoverySettings, RestartSettings, Seeded,
                                  ServerSettings, ServeSettings, ThreadSettings, Trackers, WorkerSettings,
                                  parse_kill)


def _one_shard_clip(clip: float, mode: str, shards: int, shards_key: str) -> None:
    """Sync's server-side clip needs the global norm, which spans every shard; shards do not exchange
    partial norms, so it needs one shard."""
    if clip and mode == "sync" and shards > 1:
        raise ConfigError("optimizer.clip_grad_norm", f"in mode 'sync' the server clips by the global norm, "
                          f"which needs {shards_key} = 1 (got {shards}: shards do not exchange partial norms)")


def _fragments(run) -> None:
    """Streaming DiLoCo's fragment pushes (psrv/server/fragments.py) step each fragment by its own optimizer:
    a clip by the global norm has no whole vector to take it over, and DC-ASGD's correction needs each
    worker's pulled weights of the whole shard, which a fragment's answer does not record."""
    if run.worker.fragments == 1:
        return
    if run.optimizer.clip_grad_norm:
        raise ConfigError("optimizer.clip_grad_norm", "clips by the global norm; fragments push one fragment at a "
                          "time (set fragments = 1 or no clip)")
    if run.optimizer.update_rule.startswith("dc-asgd"):
        raise ConfigError("optimizer.update_rule", f"{run.optimizer.update_rule!r} corrects by each worker's pulled "
                          "weights of the whole shard; fragments pull one fragment at a time")
    if run.quorum_wait:
        raise ConfigError("quorum_wait", "holds pulls for a whole push's merge; with fragments each merges alone")


def _dn_period(optim: OptimConfig, mode: str, workers: int) -> int:
    """dn's N: given, or the number of workers (the paper's); in sync each clock is one update of the
    mean, so N is 1 there (dn is then SGD-Nesterov) and another N is refused."""
    if mode == "sync":
        if optim.dn_period > 1:
            raise ConfigError("optimizer.dn_period", "in mode 'sync' each clock is one update: dn there is "
                              f"sgd-nesterov with N = 1 (got {optim.dn_period}); remove it")
        return 1
    return optim.dn_period or workers


def _staleness_rule(optim: OptimConfig, mode: str, quorum: int = 0) -> None:
    """staleness-lr, dc-asgd and dc-asgd-a correct a push for its staleness (or for the weights moved since its
    worker pulled). A sync clock is stepped on the mean of pushes that all read the same weights, at
    staleness 0, so each of them would silently be plain there: refused instead. Under a quorum the pushes of a
    merge do have ages (a merge old, most of them), but the rule sees only the merge's mean, at staleness 0: a
    correction per push inside a merge is not built, so refused too, with that said. dn stays: in sync it is
    SGD-Nesterov (N = 1), DiLoCo's outer step, and a mode sweep of one dn config runs."""
    if mode == "sync" and optim.update_rule in STALENESS_RULES:
        if quorum:
            raise ConfigError("optimizer.update_rule", f"{optim.update_rule!r} corrects each push for its staleness, "
                              "but a quorum merge steps once on the mean of its pushes, which the rule would see at "
                              "staleness 0 (a correction per push inside a merge is not built): use mode async or "
                              "ssp, or update_rule plain")
        raise ConfigError("optimizer.update_rule", f"{optim.update_rule!r} corrects a push for its staleness, "
                          "which mode 'sync' does not have (each clock steps on the mean at staleness 0): "
                          "use mode async or ssp, or update_rule plain")


def _onebit_adam(optim: OptimConfig, mode: str, backup_workers: int, quorum: int = 0) -> None:
    """onebit_adam is built for sync: each clock's mean of the workers' momenta is the momentum of the
    mean gradient only when every worker pushes every clock (psrv/server/onebit_adam.py)."""
    if optim.name == "onebit_adam" and (mode != "sync" or backup_workers or quorum):
        raise ConfigError("optimizer.name", "onebit_adam runs in mode 'sync' without backup_workers or quorum "
                          f"(mode is {mode!r}, backup_workers {backup_workers}, quorum {quorum})")


def _quorum(quorum: int, workers: int, key: str) -> None:
    if quorum > workers:
        raise ConfigError("quorum", f"must be at most {key} ({workers}); got {quorum}")


def _momentum_correction(run: RunConfig) -> None:
    """Momentum correction (on by default where a lossy codec with error feedback meets the servers' SGD
    momentum: psrv/client/momentum_correction.py) pushes velocities, which an update rule that needs the raw
    gradient, or sync's server-side clip of the mean gradient, cannot take: refused here, before any
    process starts, as a worker would refuse it at HELLO."""
    o = run.optimizer
    if not (run.worker.momentum_correction and corrects(run) and run.mode in MODES):
        return
    if o.update_rule not in VELOCITY_RULES:
        why = f"update rule {o.update_rule!r} needs the raw gradient"
    elif run.mode == "sync" and o.clip_grad_norm:
        why = "in sync the servers clip each clock's mean gradient"
    else:
        return
    raise ConfigError("worker.momentum_correction", f"is needed here: momentum correction (the default with a "
                      f"lossy compress, its error feedback and SGD momentum) pushes velocities, and {why}")


def _allreduce_settings(run: RunConfig) -> None:
    """The all-reduce settings go with the modes that use them: a comm hook with DDP's (ddp, zero1,
    without local steps), a barrier and a stall timeout with any all-reduce mode; local steps with ddp only."""
    hooked = run.mode in ("ddp", "zero1") and not run.worker.local_updates
    if run.allreduce.ddp_comm_hook != "none" and not hooked:
        raise ConfigError("allreduce.ddp_comm_hook", f"is a DDP hook: mode ddp or zero1 without local steps "
                          f"(mode is {run.mode!r}{', with local steps' if run.worker.local_updates else ''})")
    if run.allreduce.wait_barrier and run.mode in MODES:
        raise ConfigError("allreduce.wait_barrier", f"is for the all-reduce modes; {run.mode!r} measures its "
                          "wait at the servers")
    if run.allreduce.stall_timeout and run.mode in MODES:
        raise ConfigError("allreduce.stall_timeout", f"watches the all-reduce modes' ranks; {run.mode!r} has "
                          "servers, whose workers time out on their own")
    if run.worker.local_updates and run.mode in ("fsdp", "zero1"):
        raise ConfigError("worker.local_steps", f"local steps over all-reduce run with mode ddp, not "
                          f"{run.mode!r}")


def _timeouts(timeouts: Timeouts) -> None:
    try:
        timeouts.check()
    except ValueError as exc:
        raise ConfigError("failure_bound", str(exc)) from None


def _backup(cfg: "ServerConfig") -> None:
    """A backup follows its primary on the shard's own transport, and keeps no checkpoint of its own (it would
    write the primary's file: one per shard) nor any CURVE keys (the replication link has none). Over torch RPC
    it joins its primary's world, which is fixed when it forms: it follows one address, a primary of its own
    shard around the same rendezvous, and the world's size counts it (`rpc_backups`)."""
    if cfg.rpc_backups and cfg.transport != "rpc":
        raise ConfigError("rpc_backups", "sizes a torch RPC world (transport rpc); a zmq backup joins its primary "
                                         "by itself (psrv serve --backup-of): remove it")
    if not cfg.backup_of:
        return
    entries = [entry.strip() for entry in cfg.backup_of.split(",")]
    for entry in entries:  # several: a shard's replicas, whichever is its primary
        problem = None if entry.startswith("@") else address_problem(entry)
        if problem:
            raise ConfigError("backup_of", problem)
    for key, value, why in (("checkpoint_dir", cfg.checkpoint_dir, "a backup keeps no checkpoint (it would write "
                             "its primary's file); remove it"),
                            ("curve_keys", cfg.curve_keys, "the replication link is not encrypted; remove it")):
        if value:
            raise ConfigError(key, f"with backup_of: {why}")
    if cfg.transport == "rpc":
        _rpc_backup(cfg, entries)
    elif any(entry.startswith("rpc://") for entry in entries):
        raise ConfigError("backup_of", "an rpc:// primary is followed over transport rpc: add transport rpc")
    if not cfg.witness:
        raise ConfigError("witness", "is needed with backup_of: a directory this backup and its primary both reach, "
                                     "where the shard's epochs are claimed (docs/reliability.md, \"Fencing\")")


def _rpc_backup(cfg: "ServerConfig", entries: list[str]) -> None:
    """Over torch RPC a backup follows one primary, its own shard's, in the world its bind names."""
    if len(entries) > 1:
        raise ConfigError("backup_of", "over transport rpc a backup follows one primary (a torch RPC world takes no "
                                       "replacement backup, which would follow several replicas)")
    if entries[0].startswith("@"):  # a ready file: checked once read (psrv/server/run.py)
        return
    master, _, member = entries[0].removeprefix("rpc://").partition("/")
    if not entries[0].startswith("rpc://"):
        raise ConfigError("backup_of", f"with transport rpc: follow rpc://HOST:PORT/server-{cfg.shard}; "
                                       f"got {entries[0]!r}")
    if member != f"server-{cfg.shard}":
        raise ConfigError("backup_of", f"a backup of shard {cfg.shard} follows rpc://HOST:PORT/server-{cfg.shard} "
                                       f"(shard is {cfg.shard}); got {entries[0]!r}")
    if cfg.bind.removeprefix("rpc://") != master:
        raise ConfigError("bind", f"a backup joins its primary's RPC world, around the rendezvous {entries[0]!r} "
                                  f"names: bind rpc://{master} (psrv serve --rpc-master {master}); got {cfg.bind!r}")


def _shallow(obj: Section, cls: type) -> dict[str, Any]:
    """The fields of `obj` that `cls` also has (a section's settings, handed to a process config)."""
    names = {f.name for f in fields(cls)}
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name in names}


@dataclass(frozen=True, kw_only=True)
class ServerConfig(UpstreamSettings, ThreadSettings, ServeSettings, ServerSettings, Consistency, Placement):
    """One shard: which one, how many in all, its workers, its address, and the settings it holds."""

    def timeouts(self, transport_floor: float = 0.0) -> Timeouts:
        """Its failover timeouts, all from failure_bound (psrv/timeouts.py)."""
        return Timeouts(self.failure_bound, self.worker_timeout, transport_floor)

    shard: int = setting(0, "this shard's index", minimum=0)
    num_shards: int = setting(1, "number of shards in all", minimum=1)
    workers: int = setting(1, "number of workers N this shard serves", minimum=1)
    bind: str = setting("tcp://127.0.0.1:0", "address to listen on; port 0 picks a free port (bind 0.0.0.0 "
                        "only on a trusted network)")
    optimizer: OptimConfig = section(OptimConfig)

    def validate(self) -> None:
        super().validate()
        if self.mode not in MODES:
            raise ConfigError("mode", f"a server holds {', '.join(MODES)}; {self.mode!r} has no servers")
        problem = address_problem(self.bind, bind=True)  # zmq would keep a port's low 16 bits
        if problem:
            raise ConfigError("bind", problem)
        if not self.shard < self.num_shards:
            raise ConfigError("shard", f"must be in [0, num_shards={self.num_shards}); got {self.shard}")
        if not self.backup_workers < self.workers:
            raise ConfigError("backup_workers", f"must be < workers ({self.workers}); got {self.backup_workers}")
        _quorum(self.quorum, self.workers, "workers")
        if self.resume and not self.checkpoint_dir:
            raise ConfigError("resume", "needs checkpoint_dir (where the checkpoints are)")
        if self.curve_keys and self.transport != "zmq":
            raise ConfigError("curve_keys", "needs transport 'zmq' (torch RPC has no authentication)")
        _backup(self)
        if self.witness:  # replicated: its failovers must not outlast a worker's timeout
            _timeouts(self.timeouts())
        _one_shard_clip(self.optimizer.clip_grad_norm, self.mode, self.num_shards, "num_shards")
        _onebit_adam(self.optimizer, self.mode, self.backup_workers, self.quorum)
        _staleness_rule(self.optimizer, self.mode, self.quorum)
        check_upstream(self)
        if self.optimizer.update_rule == "dn":  # the shard is told its N
            n = _dn_period(self.optimizer, self.mode, self.workers)
            if n != self.optimizer.dn_period:
                object.__setattr__(self, "optimizer", replace(self.optimizer, dn_period=n))


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(ThreadSettings, WorkerSettings, Seeded, Placement, GradClip):
    """One worker: the shards it talks to, its rank, the job and the disturbances it emulates, and its
    gradient clip (applied by the worker in async and ssp; in sync the servers clip)."""

    servers: tuple[str, ...] = setting((), "shard addresses, in shard order", flag="")
    rank: int = setting(0, "this worker's rank", minimum=0)
    world_size: int = setting(1, "number of workers", minimum=1)
    curve_keys: str = setting("", "connect with CURVE as worker-RANK (DIR holds server.key and "
                              "worker-RANK.key_secret; see psrv keygen)", metavar="DIR")
    job: JobConfig = section(JobConfig)
    faults: FaultConfig = section(FaultConfig)

    def validate(self) -> None:
        super().validate()
        if not self.servers:
            raise ConfigError("servers", "name at least one shard address (tcp://host:port)")
        try:
            check_shard_addresses(self.servers)  # an @FILE entry is checked once read
        except ValueError as exc:
            raise ConfigError("servers", str(exc)) from None
        if any(a.startswith("rpc://") for a in self.servers) != (self.transport == "rpc"):
            raise ConfigError("servers", "rpc://HOST:PORT/server-<i> addresses go with transport 'rpc', "
                                         "tcp:// ones with 'zmq'")
        if not self.rank < self.world_size:
            raise ConfigError("rank", f"must be in [0, world_size={self.world_size}); got {self.rank}")


@dataclass(frozen=True, kw_only=True)
class RunConfig(Trackers, Seeded, Consistency):
    """A whole run: the cluster, the job, the optimizer, and the servers' and workers' settings.
    `psrv run` and every run of a spec are one of these; the run directory stores it as config.json."""

    cluster: ClusterConfig = section(ClusterConfig)
    job: JobConfig = section(JobConfig)
    optimizer: OptimConfig = section(OptimConfig)
    server: ServerSettings = section(ServerSettings)
    worker: WorkerSettings = section(WorkerSettings)
    faults: FaultConfig = section(FaultConfig)
    allreduce: AllReduceSettings = section(AllReduceSettings)
    network: NetworkSettings = section(NetworkSettings)
    kill: KillSettings = section(KillSettings)
    checkpoints: RecoverySettings = section(RecoverySettings)
    nemesis: NemesisSettings = section(NemesisSettings)
    restarts: RestartSettings = section(RestartSettings)
    hierarchy: HierarchySettings = section(HierarchySettings)

    def validate(self) -> None:
        super().validate()
        _allreduce_settings(self)
        check_hierarchy(self)
        _kills_and_recovery(self)
        check_nemesis(self)
        if self.cluster.replicas:
            _timeouts(Timeouts(self.server.failure_bound, self.server.worker_timeout,
                               request=self.worker.request_timeout))
        n = self.cluster.workers
        if self.backup_workers >= n:
            raise ConfigError("backup_workers", f"must be < cluster.workers ({n}); got {self.backup_workers}")
        _quorum(self.quorum, n, "cluster.workers")
        straggler = self.faults.straggler_pair()
        if straggler and straggler[0] >= n:
            raise ConfigError("faults.straggler", f"rank must be in 0..{n - 1} (cluster.workers = {n}); "
                                                  f"got {straggler[0]}")
        if self.mode not in MODES:
            if self.cluster.transport != "zmq":
                raise ConfigError("cluster.transport", f"not used by mode {self.mode!r} (it has no servers)")
            if self.worker.wire_dtype != "float32":
                raise ConfigError("worker.wire_dtype", f"is for the parameter server's pushes; mode "
                                                       f"{self.mode!r} all-reduces float32")
            if self.worker.compress:
                raise ConfigError("worker.compress", f"is for the parameter server's pushes; mode "
                                                     f"{self.mode!r} all-reduces float32")
            if self.optimizer.update_rule != "plain":
                raise ConfigError("optimizer.update_rule", f"is how a shard treats a push; mode {self.mode!r} has "
                                  "no shards (its optimizer steps on the all-reduced gradient): remove it")
            if self.worker.compress_pull:
                raise ConfigError("worker.compress_pull", f"is for the parameter server's pulls; mode "
                                                          f"{self.mode!r} has none (--ddp-comm-hook compresses)")
            for key, default in (("fragments", 1), ("outer_dtype", "float32")):
                if getattr(self.worker, key) != default:
                    raise ConfigError(f"worker.{key}", f"is for the parameter server's pushes of local steps; "
                                      f"mode {self.mode!r} all-reduces float32 pseudo-gradients")
            if isinstance(self.worker.local_steps, str):
                raise ConfigError("worker.local_steps", f"{self.worker.local_steps!r} plans each worker's "
                                  f"pushes by its speed through the servers; mode {self.mode!r} has none "
                                  "(give an integer H)")
        _one_shard_clip(self.optimizer.clip_grad_norm, self.mode, self.cluster.servers, "cluster.servers")
        _onebit_adam(self.optimizer, self.mode, self.backup_workers, self.quorum)
        _staleness_rule(self.optimizer, self.mode, self.quorum)
        extrapolate_in_run(self)
        check_in_place_run(self)
        if self.optimizer.name == "onebit_adam" and (self.worker.local_updates or self.worker.wire_dtype != "float32"
                                                     or self.worker.compress in CASTS):
            raise ConfigError("optimizer.name", "onebit_adam's workers push float32 gradients, then codec-compressed "
                              "momenta: no local steps, wire_dtype or float16/bfloat16 compress")
        _momentum_correction(self)
        if self.mode in MODES:
            run_knobs(self)
        _fragments(self)
        if self.network.bandwidth and self.cluster.transport != "zmq":
            raise ConfigError("network.bandwidth", "emulated hosts carry the zmq transport and the all-reduce "
                                                   f"modes; transport {self.cluster.transport!r} stays on 127.0.0.1")
        if self.optimizer.update_rule == "dn":
            _dn_period(self.optimizer, self.mode, n)

    @property
    def is_allreduce(self) -> bool:
        """True for the all-reduce baseline (no servers)."""
        return self.mode not in MODES

    def server_config(self, shard: int, *, bind: str) -> ServerConfig:
        """Shard `shard`'s config: this run's consistency, optimizer and server settings (over torch RPC, the
        backups per shard its world holds)."""
        rpc_backups = {"rpc_backups": self.cluster.replicas} if self.cluster.transport == "rpc" else {}
        return ServerConfig(shard=shard, num_shards=self.cluster.servers, workers=self.cluster.workers,
                            bind=bind, optimizer=self.optimizer, **rpc_backups, **_shallow(self, Consistency),
                            **_shallow(self.cluster, Placement), **_shallow(self.server, ServerSettings))

    def worker_config(self, rank: int, *, servers: tuple[str, ...]) -> WorkerConfig:
        """Worker `rank`'s config: this run's job, seed, faults and worker settings."""
        return WorkerConfig(servers=servers, rank=rank, world_size=self.cluster.workers, seed=self.seed,
                            job=self.job, faults=self.faults, clip_grad_norm=self.optimizer.clip_grad_norm,
                            **_shallow(self.cluster, Placement),
                            **_shallow(self.worker, WorkerSettings))


def _kills_and_recovery(run: RunConfig) -> None:
    """A kill names a shard or a worker the run has and can lose (rank 0 only if it comes back); restarting a shard
    or a worker needs zmq (a torch RPC world cannot take a restarted member back) and a worker a mode with shards."""
    server = parse_kill(run.kill.server, first="SHARD")
    if server is not None:
        if run.is_allreduce:
            raise ConfigError("kill.server", f"mode {run.mode!r} has no servers; kill a worker instead")
        if server[0] >= run.cluster.servers:
            raise ConfigError("kill.server", f"shard must be in 0..{run.cluster.servers - 1} (cluster.servers = "
                                             f"{run.cluster.servers}); got {server[0]}")
    worker = parse_kill(run.kill.worker, first="RANK")
    if worker is not None:
        if run.is_allreduce:
            raise ConfigError("kill.worker", f"mode {run.mode!r} cannot lose a rank (its collectives wait for every "
                                             "rank); kill a worker of sync, async or ssp")
        lowest = 0 if run.restarts.workers else 1  # rank 0 writes the final weights: killed, it must come back
        if not lowest <= worker[0] < run.cluster.workers:
            raise ConfigError("kill.worker", f"rank must be in {lowest}..{run.cluster.workers - 1} (rank 0 writes the "
                                             "final weights: killed only with restarts.workers; cluster.workers = "
                                             f"{run.cluster.workers}); got {worker[0]}")
    if run.restarts.workers:
        if run.is_allreduce:
            raise ConfigError("restarts.workers", f"mode {run.mode!r} cannot take a rank back (its collectives wait "
                                                  "for every rank); restart workers of sync, async or ssp")
        if run.cluster.transport != "zmq":
            raise ConfigError("restarts.workers", "restarts a worker with its rank, which needs transport 'zmq' "
                                                  "(a torch RPC world takes no one back)")
    if run.cluster.replicas:
        if run.is_allreduce:
            raise ConfigError("cluster.replicas", f"replicates shards; mode {run.mode!r} has none")
        if run.checkpoints.every:
            raise ConfigError("cluster.replicas", "and checkpoints.every are two ways to survive a dead shard; "
                              "give one (replicas lose nothing; checkpoints lose the clocks since the last)")
    if run.checkpoints.every:
        if run.is_allreduce:
            raise ConfigError("checkpoints.every", f"checkpoints shards; mode {run.mode!r} has none")
        if run.cluster.transport != "zmq":
            raise ConfigError("checkpoints.every", "restarts a shard on its address, which needs "
                                                           "transport 'zmq' (a torch RPC world takes no one back)")
