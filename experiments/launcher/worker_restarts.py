"""Workers psrv run brings back (`--restart-workers N`, spec key restarts.workers): a worker that dies during the
run (`--kill-worker`, a crash, a kill from outside) is started again with its rank, its exact command line, and
its dead life's log kept as DIR/worker-R.log.1 (.2, ...). It rejoins at the shards' clock and runs to the run's
end (psrv.Worker `start_step`); summary.json's `faults.worker_restarts` lists each restart (docs/reliability.md)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from psrv.atomic import write_json
from psrv.config import RunConfig
from psrv.experiments.launcher.kills import Kills, how_ended, worker0_steps
from psrv.experiments.launcher.nemesis.targets import configuration, latest

BAD_INPUT = 2  # psrv's exit code for a ValueError (psrv/cli/main.py): a restart would fail alike


def _lived(out: Path, name: str) -> int | None:
    """The steps a worker's life logged as its progress file last said (every 10 steps; psrv/client/steplog.py)."""
    try:
        return int((out / f"{name}.progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return None


def _shards_alive(cluster) -> bool:
    """Whether some replica of some shard still runs: a first primary (server-K), or with --replicas a backup
    (backup-K-J), which may have taken its shard over: a run whose first primaries all died goes on."""
    return any(p.poll() is None for n, p in cluster.procs.items() if n.startswith(("server-", "backup-")))


def _to_primaries(out: Path, argv: list[str], shards: int) -> None:
    """Point a worker's config (`--config FILE` in its argv) at each shard's current primary, the witness's latest
    (experiments/launcher/nemesis/targets.py), as @DIR/<name>.addr: a new life knows a shard's other replicas only from the
    WELCOME of one that answers, and the first primary it was started with may be dead or fenced by now."""
    path = Path(argv[argv.index("--config") + 1])
    cfg = json.loads(path.read_text())
    servers = list(cfg["servers"])
    for k in range(shards):
        primary = configuration(out, k).primary
        if primary is not None and (out / f"{primary}.addr").exists():
            servers[k] = f"@{out / f'{primary}.addr'}"
    write_json(path, {**cfg, "servers": servers})


def _replicas(out: Path, shards: int) -> dict[str, list[str]]:
    """Each shard's replicas as its witness names them now, primary first (psrv/client/psclient.py reads them from
    PSRV_REPLICAS): a new life whose HELLO finds the primary it was given dead tries the others."""
    known = {}
    for k in range(shards):
        config = latest(out, k)
        if config is not None and config.get("primary"):
            known[str(k)] = [config["primary"], *config.get("backups", [])]
    return known


class WorkerRestarts:
    """Restarts dead workers, at most cfg.restarts.workers times per rank; `done` records each restart. A
    worker that exits with psrv's bad-input code 2 is not restarted (it would fail alike), nor one that dies
    once every shard has ended (the run's training is over: nothing to rejoin). Those deaths, and every death
    with restarts off, go to `fallback` (experiments/launcher/kills.py ShardRestarts.recover: a worker killed on
    purpose is left behind, any other ends the run)."""

    def __init__(self, cfg: RunConfig, out: Path, started: float, kills: Kills):
        self.out, self.started, self.kills = out, started, kills
        self.limit = cfg.restarts.workers
        self.replicated = cfg.cluster.servers if cfg.cluster.replicas else 0  # shards whose primary may move
        self.done: list[dict] = []

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def recover_or(self, fallback: Callable) -> Callable:
        """The cluster's `recover` (experiments/launcher/cluster.py): a worker this can restart comes back, the rest go to
        `fallback`."""
        def recover(cluster, name: str) -> bool:
            if self._restartable(cluster, name):
                return self._restart(cluster, name)
            if name.startswith("worker-") and int(name.split("-", 1)[1]) in self.ranks:  # a later life: not spared
                return False
            return fallback(cluster, name)
        return recover

    def _restartable(self, cluster, name: str) -> bool:
        if not self.enabled or not name.startswith("worker-") or cluster.procs[name].returncode == BAD_INPUT:
            return False
        return _shards_alive(cluster)

    def _restart(self, cluster, name: str) -> bool:
        old = cluster.procs[name]
        rank, code = int(name.split("-", 1)[1]), old.returncode
        lives = sum(1 for r in self.done if r["rank"] == rank)
        killed = any(k.get("pid") == old.pid for k in self.kills.done)  # this life, not an earlier one
        cause = (self.kills.said(name) if killed else "") or (
            f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
        if lives >= self.limit:
            cluster.explain[name] = lambda _code, c=cause, n=lives: (
                f"{name} (rank {rank}) {c}; it was restarted {n} times already, the most --restart-workers "
                f"{self.limit} allows; its output: {self.out / f'{name}.log'}")
            return False
        steps, step0 = _lived(self.out, name), worker0_steps(self.out)  # before its progress file moves aside
        for r in self.done:  # the life that died had joined if it wrote its progress file
            if r["process"] == name and r["joined"] is None:
                r["joined"] = steps is not None
        # the dead life's log, progress and (SIGTERMed) record stay; the new life's progress file appears once it
        # has joined (its step loop began: psrv/client/steplog.py)
        for kept in (f"{name}.log", f"{name}.progress", f"{name}.json"):
            if (self.out / kept).exists():
                (self.out / kept).rename(self.out / f"{kept}.{lives + 1}")
        env = {"PSRV_PREDECESSOR_DEAD": "1"}  # the shards hand it the rank at once (psrv/server/membership/identity.py)
        if self.replicated:
            _to_primaries(self.out, list(old.args), self.replicated)
            env["PSRV_REPLICAS"] = json.dumps(_replicas(self.out, self.replicated))  # where to go if that one dies
        cluster.start(name, list(old.args), env=env)  # its command line as launched (launch.py worker_argv)
        self.done.append({"process": name, "rank": rank, **how_ended(code), "step": step0,
                          "rank_steps": steps, "wall_s": round(time.monotonic() - self.started, 3),
                          "cause": cause, "life": lives + 2, "joined": None})
        return True

    def tick(self, cluster) -> None:
        """At the launcher's ticks: once every shard has ended, a restarted life that never joined (no progress
        file) can join nothing: it is stopped (SIGKILL), left out of the run (no record), `joined` False."""
        waiting = [r for r in self.done if r["joined"] is None]
        if not waiting or _shards_alive(cluster):
            return
        for r in waiting:
            name = r["process"]
            r["joined"] = (self.out / f"{name}.progress").exists()
            if not r["joined"] and cluster.procs[name].poll() is None:
                cluster.spared.add(name)
                cluster.procs[name].kill()  # SIGTERM would have it write a record of its 0 steps

    @property
    def ranks(self) -> set[int]:
        """The ranks restarted at least once."""
        return {r["rank"] for r in self.done}

    def missing(self, killed: set[int]) -> int:
        """How many ranks write no record: those `killed` on purpose and not restarted, and those whose last
        restart never joined (the run ended first)."""
        last = {r["rank"]: r for r in self._settled()}
        return len(killed - set(last)) + sum(1 for r in last.values() if not r["joined"])

    def _settled(self) -> list[dict]:
        """The restarts, each life's `joined` known by now (the run is over)."""
        for r in self.done:
            if r["joined"] is None:
                r["joined"] = (self.out / f"{r['process']}.progress").exists()
        return self.done

    def summary(self) -> dict:
        """summary.json's `faults` keys for workers: each restart (rank, exit_code and signal, worker 0's `step`
        and the dead life's own `rank_steps` as last written, `wall_s` since the launch, `cause`, the new `life`,
        whether it `joined`: False when the run ended before it could), and `unrecorded_steps`: the dead lives'
        steps summed, which no record holds, so summary.json's samples_per_second, pushes and steps.csv leave
        them out (the goodput block's useful samples count the pushes the shards applied, theirs too)."""
        settled = self._settled()
        return {"worker_restarts": settled, "restart_workers": self.limit, "unrecorded_steps": unrecorded_steps(settled)}


def unrecorded_steps(restarts: list[dict]) -> int:
    """The steps of the worker lives that died without a record: each restart's `rank_steps`, summed."""
    return sum(int(r.get("rank_steps") or 0) for r in restarts)
