"""A local cluster of real processes on 127.0.0.1: servers and workers started together; `psrv run` calls this."""
from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Callable

from psrv.config import RunConfig, ServerConfig, to_dict
from psrv.config.base import config_hash
from psrv.config.hierarchy import region_of

from psrv.experiments.launcher.cluster import Cluster, RunFailed, RunInterrupted, free_port
from psrv.experiments.launcher.deaths import Deaths
from psrv.experiments.launcher.goodput import baseline as goodput_baseline, reckon
from psrv.experiments.launcher.kills import Kills, ShardRestarts
from psrv.experiments.launcher.nemesis import Nemesis, check_launch as check_nemesis, checkpoint_disk, needs_hosts
from psrv.experiments.launcher.worker_restarts import WorkerRestarts
from psrv.experiments.launcher.netns import EmulatedHosts, host_traffic
from psrv.experiments.launcher.preflight import preflight
from psrv.experiments.launcher.regions import hosts_needed, start_tiers, summary as regions_summary, worker_host
from psrv.experiments.launcher.progress import progress_bar
from psrv.experiments.launcher.replication import (StartupRestarts, replicated, settle as settle_replicas,
                                          start_backups, start_replacement, wait_following)
from psrv.experiments.launcher.rundir import OwnedFolder
from psrv.experiments.launcher.schedulers import check_scheduler, scheduler_hosts
from psrv.experiments.launcher.stall import StallWatch
from psrv.experiments.launcher.script import Script, check_records, start_script_workers
from psrv.experiments.launcher.torchrun import check_launcher, rank_output, start_torchrun_workers
from psrv.experiments.launcher.summary import build_summary, write_tables
from psrv.atomic import write_json

log = logging.getLogger("psrv.run")


def _psrv(*args: str, python: str = sys.executable) -> list[str]:
    """A psrv process's argv. -P: the current folder is not on its sys.path, so a user's own package named
    like one of psrv's cannot shadow it (a user's job module is still imported from there: psrv.workers.jobs)."""
    return [python, "-P", "-m", "psrv.cli", *args]


def server_argv(config: str, out: str, shard: int | str, extra: list[str], *,
                python: str = sys.executable) -> list[str]:
    """Shard `shard`'s `psrv serve`, given its config file, writing its record to OUT/server-K.json: what the
    local launcher starts, and what a scheduler's manifests start (experiments/launcher/kubernetes.py)."""
    return _psrv("serve", "--config", config, "--out", f"{out}/server-{shard}.json", *extra, python=python)


def worker_argv(config: str, out: str, rank: int | str, mode: str, extra: list[str], *,
                python: str = sys.executable) -> list[str]:
    """Rank `rank`'s `psrv worker` (the shipped loop), writing OUT/worker-R.json and its progress file;
    rank 0 also gets `rank0_argv`. Shared with the scheduler's manifests, as `server_argv` is."""
    return _psrv("worker", "--config", config, "--out", f"{out}/worker-{rank}.json", "--progress-file",
                 f"{out}/worker-{rank}.progress", *extra, "--mode", mode, python=python)


def rank0_argv(out: str) -> list[str]:
    """What rank 0 alone writes: the final flat parameters and its model.state_dict()."""
    return ["--params-out", f"{out}/params.pt", "--state-out", f"{out}/model.pt"]


def write_config(path: Path, cfg) -> Path:
    """A process's resolved config as JSON: what it is started with (`--config path`) and what it ran."""
    write_json(path, to_dict(cfg))
    return path


def run_local(cfg: RunConfig, *, out: Path, metrics: bool = False, metrics_linger: float = 0.0,
              timeout: float = 1800.0, progress: bool = True,
              on_progress: Callable[[int], None] | None = None, script: Script | None = None,
              launcher: str = "psrv", say: Callable[[str], None] = log.info, owner: OwnedFolder | None = None,
              scheduler: str = "local", baseline: Path | None = None, fork_server: bool = True) -> dict:
    """Run `cfg` on a local cluster; write DIR/config.json (the resolved config), summary.json, steps.csv,
    evals.csv, and return the summary. `metrics`: every process serves /metrics (DIR/targets.json).
    `script`: the workers are that script (a user's loop on psrv.Worker, experiments/launcher/script.py), not the
    shipped loop over cfg.job. `launcher` (experiments/launcher/torchrun.py LAUNCHERS): how the script's workers are
    started, one process per rank ("psrv") or all as one torchrun process ("torchrun"). `scheduler`: where
    the processes start (experiments/launcher/schedulers.py; "slurm": each a job step of one SLURM allocation, DIR on
    a filesystem its nodes share). `baseline`: a finished fault-free run's folder, whose useful samples/s the
    summary's `goodput` is measured against (experiments/launcher/goodput; psrv run --goodput-baseline). `fork_server`
    False: each psrv process imports torch itself, not forked from the run's fork server (experiments/launcher/forkserver.py;
    the start-up bench's baseline). summary.json says which launcher and scheduler; neither is part of the
    config or its hash, since the run computes the same.

    DIR is this run's alone while it runs (experiments/launcher/rundir.py): a folder another run owns is refused
    (FolderInUse, a ValueError), and what an earlier run left there is removed first, `say` telling the
    user in one line (a folder with files no run wrote is refused). `owner`: the folder's lock, when the
    caller took it already (the experiment runner, which writes beside the run).

    on_progress(steps done by all workers so far) is called while it runs (for an outer progress bar).
    Ctrl-C (KeyboardInterrupt) while it runs: the workers get SIGINT and up to 3 s to leave and write
    their records, the rest are stopped, what ran is written (summary.json `complete` False), and
    RunInterrupted is raised. A run that fails once its processes started (a death nothing survives or brings
    back, a stall, the timeout: RunFailed) is stopped alike, and what ran is written, `complete` False with
    its `cause` (the failure's first line); the RunFailed raised then carries that summary."""
    if script is None and cfg.job.script:
        raise ValueError(f"job.script {cfg.job.script}: pass the run's Script (experiments/launcher/script.py Script.of)")
    check_launcher(launcher, script, cfg.mode, hosts=emulated_by(cfg))
    if script is None:
        preflight(cfg)  # a device that is not here, a job that does not import: ValueError before any process
    rate = cfg.network.bandwidth
    check_scheduler(scheduler, metrics=metrics, bandwidth=rate)
    check_nemesis(cfg, scheduler=scheduler, metrics=metrics)  # experiments/launcher/nemesis: root, hosts
    if cfg.cluster.replicas:  # the failover timeouts, all from --failure-bound (psrv/timeouts.py)
        say(cfg.server_config(0, bind="tcp://127.0.0.1:0").timeouts().line())
    if scheduler != "local" and (cfg.kill.server or cfg.kill.worker or cfg.checkpoints.every or cfg.cluster.replicas):
        raise ValueError(f"--kill-server, --kill-worker, --checkpoint-every and --replicas need --scheduler local (the "
                         f"launcher signals, restarts and pairs its own processes); got {scheduler!r}")
    if cfg.kill.worker and script is not None:
        raise ValueError("--kill-worker: a script's run needs every rank's record; kill a worker of the shipped loop")
    if cfg.restarts.workers and (script is not None or scheduler != "local"):
        raise ValueError("--restart-workers restarts the shipped loop's workers (psrv worker) under --scheduler local; "
                         "a script's and a scheduler's workers are not restarted here")
    if rate and metrics:
        raise ValueError(f"network.bandwidth {rate}: --metrics serves each process's /metrics on its own emulated "
                         "host, out of Prometheus's reach; run without one of them")
    if baseline is not None and cfg.hierarchy.tiered:
        raise ValueError("--goodput-baseline reads the shards' histories, which do not follow a sync between regions "
                         "(--regions with --region-every > 0); run without one of them")
    if baseline is not None and Path(baseline).resolve() == Path(out).resolve():
        raise ValueError(f"--goodput-baseline {baseline} is this run's own folder; name a finished fault-free run's")
    base = None if baseline is None else goodput_baseline(Path(baseline), cfg)  # measured now: a bad one fails first
    owned = contextlib.nullcontext(owner) if owner is not None else OwnedFolder(out, what="psrv run")
    with owned as folder, contextlib.ExitStack() as stack:
        removed = folder.clear()
        if removed:
            say(f"{out}: removed the {len(removed)} files the run before left there ({_listed(removed)}); "
                "this run writes its own")
        processes = cfg.cluster.workers + (0 if cfg.is_allreduce else cfg.cluster.servers * (1 + cfg.cluster.replicas))
        if cfg.hierarchy.regions > 1:  # a host per region, and one for the global shards
            processes = hosts_needed(cfg)
        hosts = stack.enter_context(EmulatedHosts(processes, rate) if emulated_by(cfg) else
                                    scheduler_hosts(scheduler, processes, out=out, timeout=timeout))
        stack.enter_context(checkpoint_disk(cfg, out))  # a tmpfs at DIR/checkpoints for the nemesis's disk_full
        return _run(cfg, out=out, metrics=metrics, metrics_linger=metrics_linger, timeout=timeout,
                    progress=progress, on_progress=on_progress, script=script, launcher=launcher, hosts=hosts,
                    lock=folder.fd, scheduler=scheduler, base=base, fork_server=fork_server)


def emulated_by(cfg: RunConfig) -> str:
    """What puts each of the run's processes on an emulated host of its own ("" nothing): said in a refusal."""
    if cfg.network.bandwidth:
        return f"--bandwidth {cfg.network.bandwidth}"
    return "--nemesis partition" if needs_hosts(cfg) else ""


def _listed(names: list[str], limit: int = 6) -> str:
    """'config.json, model.pt, ...': the notable ones first (what a user would look for), then the rest."""
    notable = [n for n in names if n.endswith((".pt", ".json", ".csv")) and not n.startswith("config-")]
    ordered = notable + [n for n in names if n not in notable]
    return ", ".join(ordered[:limit]) + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def _run(cfg: RunConfig, *, out: Path, metrics: bool, metrics_linger: float, timeout: float, progress: bool,
         on_progress: Callable[[int], None] | None, script: Script | None, launcher: str,
         hosts: EmulatedHosts | None, lock: int | None, scheduler: str, base: dict | None = None,
         fork_server: bool = True) -> dict:
    write_config(out / "config.json", cfg)
    workers = cfg.cluster.workers
    shards = 0 if cfg.is_allreduce else cfg.cluster.servers * (1 + cfg.cluster.replicas)  # primaries and backups
    cluster = Cluster(out, processes=workers + shards, hosts=hosts,
                      keep_fds=() if lock is None else (lock,), fork_server=fork_server)
    # every process records its history there (docs/history.md), and a shard obeys the faults a nemesis writes
    cluster.env.update({"PSRV_HISTORY": str(out / "history"), "PSRV_FAULTS": str(out / "faults")})
    extra = ["--metrics-port", "0", "--metrics-linger", repr(metrics_linger)] if metrics else []
    bar, interrupt, watch = None, None, None
    started = time.monotonic()
    kills = Kills(cfg, out, started)
    nemesis = Nemesis(cfg, out, started)  # --nemesis: faults on a schedule (experiments/launcher/nemesis)
    backups: list[str] = []  # with --replicas: every backup started (experiments/launcher/replication.py)

    def start_backup(name: str, shard: int, host: int, config: ServerConfig, tail: list[str]) -> None:
        _start_backup(cluster, out, name, host, config, [*tail, *extra])

    def bind(host: int) -> str:  # a backup's own address (its emulated host's, else 127.0.0.1)
        return f"tcp://{cluster.address(host)}:0"
    restarts = ShardRestarts(cfg, out, started, kills,
                             start=lambda i, shard, ready: _start_server(cluster, out, f"server-{i}", shard, ready, extra),
                             replace_replica=lambda shard: start_replacement(cfg, out, shard, start_backup, backups,
                                                                             bind=bind))
    workers_back = WorkerRestarts(cfg, out, started, kills)  # --restart-workers: experiments/launcher/worker_restarts.py
    # every death the others do not record, and a worker's survived where the mode allows: experiments/launcher/deaths.py
    deaths = Deaths(cfg, out, started, script=script is not None, steps=cfg.job.steps if script is None else
                    script.steps, said=lambda n, pid: kills.said(n) or nemesis.said(n, pid), restarted=lambda: workers_back.ranks)
    cluster.recover = deaths.recover_or(workers_back.recover_or(restarts.recover))
    failure = None  # the RunFailed that ended the run: what ran is written all the same, marked incomplete
    try:
        if cfg.is_allreduce:
            servers = []
            if script is not None:  # the script's psrv.make_worker is the all-reduce worker
                names = start_script_workers(cluster, cfg, out, script, servers, metrics=metrics,
                                             linger=metrics_linger)
            else:
                from psrv.experiments.launcher.launch_ddp import start_ddp
                names = start_ddp(cluster, cfg, out)
            if scheduler == "local":  # a rank with no step for the bound ends the run (experiments/launcher/stall.py)
                watch = StallWatch(cluster, names, out, fixed=cfg.allreduce.stall_timeout)
        else:
            settings = lambda i, c: replicated(cfg, out, restarts.shard_settings(i, c))  # noqa: E731
            if cfg.hierarchy.tiered:  # regional shards under global ones: experiments/launcher/regions.py
                def start_shard(name: str, host: int, config: ServerConfig, ready: Path) -> None:
                    _start_server(cluster, out, name, config, ready, extra, host=host)
                servers, by_region = start_tiers(cfg, out, cluster.address, start_shard)
                names = _start_workers(cluster, cfg, out, lambda rank: by_region[region_of(
                    rank, cfg.cluster.workers, cfg.hierarchy.regions)], extra)
            else:
                servers = _start_servers(cluster, cfg, out, extra, settings)
                rendezvous = servers[0][1].rsplit("/", 1)[0] if cfg.cluster.transport == "rpc" else ""  # rpc://HOST:PORT
                backups += start_backups(cfg, out, start_backup,  # --replicas: experiments/launcher/replication.py
                                         bind=(lambda host: rendezvous) if rendezvous else bind)
                servers += [(name, "") for name in backups]
                if backups and not rendezvous:  # over zmq; an RPC world forms only once the workers join it too
                    def restart_shard(shard: int) -> None:  # before the workers: its replicas start again, whole
                        _start_server(cluster, out, f"server-{shard}", settings(shard, cfg.server_config(
                            shard, bind=f"tcp://{cluster.address(shard)}:0")), out / f"server-{shard}.addr", extra)
                        start_backups(cfg, out, start_backup, bind=bind, shards=[shard])
                    startup = StartupRestarts(out, restart_shard)
                    recover, cluster.recover = cluster.recover, deaths.recover_or(startup.recover)
                    wait_following(cluster, out, backups)
                    cluster.recover = recover
                    restarts.dead_replicas += startup.done
                start = start_torchrun_workers if launcher == "torchrun" else start_script_workers
                primaries = [(n, a) for n, a in servers if a]
                names = start(cluster, cfg, out, script, primaries, metrics=metrics, linger=metrics_linger) \
                    if script else _start_workers(cluster, cfg, out, [a for _, a in primaries], extra)
        steps = cfg.job.steps if script is None else script.steps
        bar = _progress(cfg, out, steps=steps, enabled=progress, on_update=on_progress)
        shards = cfg.cluster.servers * (cfg.hierarchy.regions + 1 if cfg.hierarchy.tiered else 1)  # and global ones
        expected = shards + workers if metrics and not cfg.is_allreduce else 0
        found = [0]

        def tick() -> None:
            bar.tick()
            kills.tick(cluster)
            nemesis.tick(cluster)
            workers_back.tick(cluster)
            if watch is not None:
                watch.check()
            if found[0] < expected:  # processes announce their /metrics ports as they start
                found[0] = write_targets(out)
        cluster.wait(names, timeout=timeout, tick=tick)
        nemesis.heal()  # a shard still paused would not end
        if script is not None:
            check_records(out, workers, script, rank_output(out, launcher))
        cluster.wait([n for n, _ in servers], timeout=60)
    except KeyboardInterrupt as exc:  # the workers first: they leave the shards and write what they did
        interrupt = exc
        cluster.interrupt([n for n in cluster.procs if not n.startswith(("server-", "global-"))], grace=3.0)
    except RunFailed as exc:  # as for Ctrl-C: the workers still running leave and write what they did
        failure = exc
        cluster.interrupt([n for n in cluster.procs if not n.startswith(("server-", "backup-", "global-"))], grace=3.0)
    finally:
        if bar is not None:
            bar.close()
        nemesis.heal()
        cluster.stop()
        network = host_traffic(cluster, cfg.network.bandwidth)
    interrupted = interrupt is not None

    def write_summary() -> dict:
        cause = None if failure is None else str(failure).splitlines()[0]
        replication = {"replication": settle_replicas(cfg, out)} if cfg.cluster.replicas else {}
        # `faults`: what was killed on purpose, which shards came back, the clocks they lost, every other death
        summary = {**build_summary(cfg, out, interrupted=interrupted, failed=cause,
                                   killed=workers_back.missing(kills.ranks | deaths.ranks)),
                   **network, **regions_summary(cfg, out), "config_hash": config_hash(cfg),  # which config made these results
                   "launcher": launcher, "scheduler": scheduler,  # how and where it ran: not what it computed
                   **({"faults": {**restarts.summary(out), **workers_back.summary(), "deaths": deaths.done,
                                  **({"nemesis": nemesis.summary()} if nemesis.asked else {})}}
                      if restarts.asked or restarts.dead_replicas or workers_back.enabled or nemesis.asked
                      or deaths.done else {}),
                   **replication}
        write_tables(out, interrupted=interrupted or failure is not None)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary
    if failure is not None:  # what ran, as far as the records tell; the failure stays the news either way
        try:
            failure.summary = write_summary()
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            log.warning("%s: what ran could not be summarised (%s: %s)", out, type(exc).__name__, exc)
        raise failure
    summary = write_summary()
    if not interrupted and (summary.get("faults") or base is not None):  # goodput and the history's verdict
        summary.update(reckon(cfg, out, summary, base=base, started=started))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if interrupt is not None:
        raise RunInterrupted(summary, interrupt) from None
    return summary


def write_targets(out: Path) -> int:
    """DIR/targets.json in Prometheus file_sd format, from the ports the processes announced."""
    groups = []
    for role in ("server", "global", "worker"):  # global: the global shards under --regions
        ports = sorted(out.glob(f"{role}-*.metrics"))
        targets = [f"127.0.0.1:{p.read_text().strip()}" for p in ports if p.read_text().strip()]
        if targets:
            groups.append({"targets": targets, "labels": {"job": "psrv", "role": role}})
    write_json(out / "targets.json", groups)
    return sum(len(g["targets"]) for g in groups)


def _start_servers(cluster: Cluster, cfg: RunConfig, out: Path, extra: list[str],
                   settings: Callable[[int, ServerConfig], ServerConfig]) -> list[tuple[str, str]]:
    """Start the shards, each with `settings(shard, its config)` (the run's checkpoints); return (name,
    address) each."""
    names = []
    rpc_master = f"{cluster.address(0)}:{free_port()}" if cfg.cluster.transport == "rpc" else ""  # shard 0 hosts it
    binds = [f"rpc://{rpc_master}" if rpc_master else f"tcp://{cluster.address(i)}:0" for i in range(cfg.cluster.servers)]
    for i in range(cfg.cluster.servers):
        ready = out / f"server-{i}.addr"
        ready.unlink(missing_ok=True)
        _start_server(cluster, out, f"server-{i}", settings(i, cfg.server_config(i, bind=binds[i])), ready, extra,
                      host=0 if cfg.hierarchy.regions > 1 else i)
        names.append((f"server-{i}", ready))
    if rpc_master:  # the RPC world forms only once the workers join it too: do not wait for the servers
        return [(n, f"rpc://{rpc_master}/server-{i}") for i, (n, _) in enumerate(names)]
    # Workers start at once and read each address from the server's ready file when it appears
    # (an address @FILE: `psrv worker --servers`, and a script's PSRV_SERVERS), so their start-up
    # overlaps the servers'.
    return [(n, f"@{r}") for n, r in names]


def _start_server(cluster: Cluster, out: Path, name: str, config: ServerConfig, ready: Path,
                  extra: list[str], *, host: int | None = None) -> None:
    """Start a shard as process `name` (server-K; global-I under --regions) with `config` (written to
    DIR/config-NAME.json, the config of its latest life), announcing its address in `ready`, writing its record
    to DIR/NAME.json; on emulated host `host` (default: its shard's index)."""
    path = write_config(out / f"config-{name}.json", config)
    argv = _psrv("serve", "--config", str(path), "--out", f"{out}/{name}.json", "--ready-file", str(ready), *extra)
    cluster.start(name, argv, host=config.shard if host is None else host)


def _start_backup(cluster: Cluster, out: Path, name: str, host: int, config: ServerConfig, tail: list[str]) -> None:
    """Start backup `name` (experiments/launcher/replication.py) with `config`, on `host` (its own emulated host, where the
    run has them)."""
    path = write_config(out / f"config-{name}.json", config)
    cluster.start(name, _psrv("serve", "--config", str(path), *tail), host=host)


def _start_workers(cluster: Cluster, cfg: RunConfig, out: Path, addresses: list[str] | Callable[[int], list[str]],
                   extra: list[str]) -> list[str]:
    """Start the shipped loop's workers, each reaching `addresses` (or `addresses(rank)`: its region's shards)."""
    names = []
    for rank in range(cfg.cluster.workers):
        mine = addresses(rank) if callable(addresses) else addresses
        config = write_config(out / f"config-worker-{rank}.json", cfg.worker_config(rank, servers=tuple(mine)))
        argv = worker_argv(str(config), str(out), rank, cfg.mode, extra)
        if rank == 0:
            argv += rank0_argv(str(out))
        cluster.start(f"worker-{rank}", argv,
                      host=worker_host(cfg, rank) if cfg.hierarchy.regions > 1 else cfg.cluster.servers + rank)
        names.append(f"worker-{rank}")
    return names


class _progress:
    """A bar over all workers' steps, fed by the workers' logs of completed steps: tqdm's on a terminal, a
    plain line every tenth of the run or minute where stderr is a log or a pipe (experiments/launcher/progress.py)."""

    def __init__(self, cfg: RunConfig, out: Path, *, steps: int | None, enabled: bool,
                 on_update: Callable[[int], None] | None = None):
        self.workers, self.out = cfg.cluster.workers, out
        self.on_update = on_update
        self.bar = None
        if enabled:
            self.bar = progress_bar(total=steps * self.workers if steps else None, desc=f"{cfg.mode} x{self.workers}",
                                    leave=False)

    def tick(self) -> None:
        if self.bar is None and self.on_update is None:
            return
        done = 0
        for rank in range(self.workers):
            p = self.out / f"worker-{rank}.progress"
            try:
                done += int(p.read_text() or 0)
            except (FileNotFoundError, ValueError):
                pass
        if self.on_update is not None:
            self.on_update(done)
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        """The bar ends at the count the workers last wrote (their records' final one included)."""
        if self.bar is not None:
            self.tick()
            self.bar.close()
