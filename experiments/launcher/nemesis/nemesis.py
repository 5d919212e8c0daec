"""The nemesis of one `psrv run`: the faults of its schedule (`--nemesis SPEC`), done at the launcher's ticks
to the processes their targets are at that moment, healed when they have lasted, and recorded."""
from __future__ import annotations

import logging
import os
import random
import subprocess
import time
from pathlib import Path

from psrv.config import RunConfig
from psrv.config.nemesis import Target
from psrv.experiments.launcher.kills import CHECKPOINTS, worker0_steps
from psrv.experiments.launcher.nemesis import faults
from psrv.experiments.launcher.nemesis.faults import NotDone
from psrv.experiments.launcher.nemesis.record import Record
from psrv.experiments.launcher.nemesis.schedule import Planned, Timeline
from psrv.experiments.launcher.nemesis.targets import configuration

log = logging.getLogger("psrv.run")
WAIT_FOR_BACKUP = 60.0  # seconds a fault on a primary waits for its shard to have a backup (Nemesis._survivable)


class Nemesis:
    """Done at the launcher's ticks (every 0.2 s, `tick`): a fault `at step N` once worker 0's progress file
    (written every 10 steps) says N, one `at Ns` N seconds after the tick that first saw a step there; so a
    fault lands up to 10 steps or one tick late. A fault that lasts is healed at the first tick after its
    duration, and every one still on is healed by `heal` (the run's end). Pausing the launcher stops this loop
    (no restarts, progress or kills meanwhile). Every fault goes to DIR/nemesis.jsonl as it is done."""

    def __init__(self, cfg: RunConfig, out: Path, started: float):
        self.cfg, self.out = cfg, out
        self.asked = bool(cfg.nemesis.schedule)
        self.timeline = Timeline(cfg.nemesis.schedule, seed=cfg.seed, servers=cfg.cluster.servers,
                                 workers=cfg.cluster.workers)
        self.record = Record(out, started)
        self.rng = random.Random(f"psrv-nemesis:{cfg.seed}:backups")  # which of shard K's backups backup:K is
        self.first_step: float | None = None  # time.monotonic() of the tick that first saw a step of worker 0
        self.healing: list[tuple[float, dict, faults.Heal]] = []  # (when, its record, its heal)
        self.waiting: list[tuple[float, Planned]] = []  # faults on a primary, held until its shard has a backup

    def tick(self, cluster) -> None:
        if not self.asked:
            return
        step, now = worker0_steps(self.out), time.monotonic()
        if self.first_step is None and step > 0:
            self.first_step = now
        self._heal(now, step)
        seconds = None if self.first_step is None else now - self.first_step
        held, self.waiting = self.waiting, []
        for planned in [p for _, p in held] + self.timeline.due(seconds=seconds, step=step):
            if self._survivable(cluster, planned) or self._gave_up(held, planned, now):
                self._do(cluster, planned, step)
            else:
                self.waiting.append((next((t for t, p in held if p is planned), now), planned))

    def _survivable(self, cluster, planned: Planned) -> bool:
        """With replicas, a kill or pause of a shard's primary waits until the shard has a live backup to take
        over, as a Jepsen nemesis keeps a majority up: a fault no replication survives tests nothing (a
        replacement backup still importing torch after the last failover, say); a fault on a backup waits for
        one to hit (the last one hit may be rejoining). Without replicas nothing waits."""
        if not self.cfg.cluster.replicas or planned.kind == "partition":
            return True
        for target in planned.targets:
            if target.role == "backup" or (target.role == "primary" and planned.kind in ("kill", "pause")):
                config = configuration(self.out, target.index)
                if not any(n in cluster.procs and cluster.procs[n].poll() is None for n in config.backups):
                    return False
        return True

    def _gave_up(self, held: list, planned: Planned, now: float) -> bool:
        """Held longer than WAIT_FOR_BACKUP: done anyway (the record says the shard had no backup)."""
        since = next((t for t, p in held if p is planned), now)
        return now - since > WAIT_FOR_BACKUP

    def heal(self) -> None:
        """Heal every fault still on (the run is ending: a paused process must take its SIGTERM)."""
        self._heal(float("inf"), worker0_steps(self.out))

    def _heal(self, now: float, step: int) -> None:
        due = [h for h in self.healing if h[0] <= now]
        self.healing = [h for h in self.healing if h[0] > now]
        for _, entry, heal in due:
            self.record.healed(entry, step=step, why=heal())

    def _do(self, cluster, planned: Planned, step: int) -> None:
        named: list[str] = []
        pids: list[int] = []
        more: dict = {}
        try:
            for target in planned.targets:
                named.append(self._process(cluster, target))
                pids.append(os.getpid() if named[-1] == "launcher" else cluster.procs[named[-1]].pid)
            heal = self._fault(cluster, planned, named, more)
        except (NotDone, OSError, subprocess.SubprocessError) as why:  # a failed `ip` or write: said, not raised
            entry = self.record.fault(kind=planned.kind, target=planned.target, at=str(planned.at),
                                      duration=planned.duration, processes=named, pids=pids, step=step, done=False,
                                      why=str(why), **more)
            log.warning("nemesis: fault %d, %s, not done: %s", entry["id"], planned, why)
            return
        entry = self.record.fault(kind=planned.kind, target=planned.target, at=str(planned.at),
                                  duration=planned.duration, processes=named, pids=pids, step=step, done=True, **more)
        log.info("nemesis: fault %d, %s: %s (pid %s) at worker 0's step %d", entry["id"], planned,
                 ", ".join(named) or "DIR/checkpoints", ", ".join(map(str, pids)) or "-", step)
        if planned.kind == "pause" and named == ["launcher"]:
            time.sleep(planned.duration)  # the launcher's own loop stops here
            self.record.healed(entry, step=worker0_steps(self.out))
        elif heal is not None:
            self.healing.append((time.monotonic() + planned.duration, entry, heal))

    def _fault(self, cluster, planned: Planned, named: list[str], more: dict) -> faults.Heal | None:
        """Do `planned` to the processes `named`; its heal, for one that lasts and is healed later."""
        kind = planned.kind
        if kind == "disk_full":
            return faults.fill(self.out / CHECKPOINTS)
        if named == ["launcher"]:
            return None
        procs = [cluster.procs[n] for n in named]
        if kind == "kill":
            faults.kill(procs[0])
            name = named[0]  # its failure line, should the run end of it, says who killed it
            cluster.explain.setdefault(name, lambda code: f"{name} {self.said(name)}; its output: "
                                                          f"{self.out / f'{name}.log'}")
            return None
        if kind == "pause":
            paused = next((e for _, e, _ in self.healing if e["kind"] == "pause" and e["processes"] == named), None)
            if paused is not None:
                raise NotDone(f"paused already by fault {paused['id']}")
            return faults.pause(procs[0])
        if kind == "late_ack":
            more["file"] = str(faults.late_ack(self.out, procs[0].pid, fault=self.record.next_id,
                                               seconds=planned.duration))
            return None
        hosts = [cluster.host_of.get(n) for n in named]  # partition
        if cluster.hosts is None or None in hosts:
            raise NotDone("the processes do not run on emulated hosts")
        more["addresses"] = [cluster.address(h) for h in hosts]
        cut = next((e for _, e, _ in self.healing if e["kind"] == "partition"
                    and sorted(e["addresses"]) == sorted(more["addresses"])), None)
        if cut is not None:
            raise NotDone(f"cut apart already by fault {cut['id']}")
        return faults.partition(cluster.hosts, *hosts)

    def _process(self, cluster, target: Target) -> str:
        """The process `target` is now (a name of cluster.procs, still running, or 'launcher'); NotDone if none."""
        if target.role == "launcher":
            return "launcher"
        if target.role == "worker":
            name = f"worker-{target.index}"
        else:
            config = configuration(self.out, target.index)
            said = f"shard {target.index}'s {target.role}" + ("" if config.epoch is None else
                                                               f" (witness epoch {config.epoch})")
            if target.role == "primary":
                if config.primary is None:
                    raise NotDone(f"{said} is no process that announced its address: {', '.join(config.unknown)}")
                name = config.primary
            else:
                alive = [n for n in config.backups if n in cluster.procs and cluster.procs[n].poll() is None]
                if not alive:
                    raise NotDone(f"{said}: none alive" + (f" (known: {', '.join(config.backups)})"
                                                           if config.backups else ""))
                name = self.rng.choice(alive)
        proc = cluster.procs.get(name)
        if proc is None:
            raise NotDone(f"no process {name} was started")
        if proc.poll() is not None:
            raise NotDone(f"{name} had ended already (exit code {proc.returncode})")
        return name

    def said(self, name: str, pid: int | None = None) -> str:
        """What killed `name` (the life of process id `pid`, where given: a restarted worker's lives share its
        name) here, for its failure line; '' when the nemesis did not."""
        kills = [f for f in self.record.faults if f["kind"] == "kill" and f["done"] and f["processes"] == [name]
                 and (pid is None or pid in f.get("pids", []))]
        kill = kills[-1] if kills else None
        return "" if kill is None else (f"was killed by the nemesis (fault {kill['id']}: kill {kill['target']} at "
                                        f"{kill['at']}, SIGKILL at worker 0's step {kill['step']})")

    def summary(self) -> dict:
        """summary.json's faults.nemesis (experiments/launcher/nemesis/record.py Record.summary)."""
        return self.record.summary(schedule=self.cfg.nemesis.schedule, seed=self.cfg.seed,
                                   not_reached=[str(p) for p in self.timeline.fixed])

