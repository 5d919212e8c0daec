"""Faults a local run injects on purpose, and the shards it brings back: `psrv run --kill-server SHARD:STEP`
(`--kill-worker RANK:STEP`) SIGKILLs that shard's server (that rank's worker) once worker 0 has done STEP
steps; with
`--checkpoint-every SECONDS` every shard checkpoints into DIR/checkpoints, and a shard that dies (killed
here or by anything else) is restarted from its checkpoint with --resume on the address its workers know.
Both are written to summary.json under `faults` (docs/reliability.md)."""
from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path
from typing import Callable

from psrv.config import RunConfig, ServerConfig
from psrv.config.sections import parse_kill

MAX_RESTARTS = 3  # a shard that keeps dying (a checkpoint it refuses, a bug) ends the run, not a loop
CHECKPOINTS = "checkpoints"  # the run folder's checkpoint directory, one file per shard (psrv/checkpoint.py)


def worker0_steps(out: Path) -> int:
    """The steps worker 0 has logged: its progress file, written every 10 steps (psrv/client/steplog.py)."""
    try:
        return int((out / "worker-0.progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


class Kills:
    """The kills a run asked for, done at the launcher's ticks (every 0.2 s) once worker 0's progress file
    reaches their step, so a kill lands at STEP to STEP + 10 of worker 0; `done` records each one."""

    def __init__(self, cfg: RunConfig, out: Path, started: float):
        self.out, self.started = out, started
        self.todo: list[tuple[str, str, int]] = []  # (process name, option as given, step)
        for role, text in (("server", cfg.kill.server), ("worker", cfg.kill.worker)):
            parsed = parse_kill(text, first="INDEX")
            if parsed is not None:
                self.todo.append((f"{role}-{parsed[0]}", f"--kill-{role} {text}", parsed[1]))
        self.done: list[dict] = []

    def tick(self, cluster) -> None:
        if not self.todo:
            return
        step = worker0_steps(self.out)
        for name, option, at in [t for t in self.todo if step >= t[2]]:
            self.todo.remove((name, option, at))
            proc = cluster.procs.get(name)
            if proc is None or proc.poll() is not None:  # gone already: say so, kill nothing
                self.done.append({"process": name, "option": option, "step": step, "killed": False})
                continue
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.done.append({"process": name, "option": option, "signal": "SIGKILL", "pid": proc.pid,
                              "step": step, "wall_s": round(time.monotonic() - self.started, 3), "killed": True})

    @property
    def ranks(self) -> set[int]:
        """The workers killed here: they write no record, and the run goes on without them."""
        return {int(k["process"].split("-")[1]) for k in self.done if k["killed"] and k["process"].startswith("worker-")}

    def said(self, name: str) -> str:
        """What killed `name`, for its failure line; '' when it was not killed here."""
        kill = next((k for k in self.done if k["process"] == name and k["killed"]), None)
        return "" if kill is None else f"was killed by {kill['option']} (SIGKILL at worker 0's step {kill['step']})"


FENCED = 3  # psrv serve's exit status when another replica took its shard over (psrv/cli/serve.py)


def ended(code: int) -> str:
    """How a process ended, for a failure line and a record's `cause`."""
    if code == FENCED:
        return "was fenced: another replica took its shard over (exit code 3)"
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def how_ended(code: int) -> dict:
    """A dead process's exit code, and the signal's name where a signal killed it (a record's `exit_code`,
    `signal`)."""
    if code >= 0:
        return {"exit_code": code, "signal": None}
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return {"exit_code": code, "signal": name}


class ShardRestarts:
    """Brings a dead shard back from its checkpoint, on its own address, so its workers' re-sends find it
    (psrv/client/roundtrip.py) and the run goes on; `done` records each restart. Without checkpoints a dead
    shard ends the run, with a line saying what killed it."""

    def __init__(self, cfg: RunConfig, out: Path, started: float, kills: Kills,
                 start: Callable[[int, ServerConfig, Path], None],
                 replace_replica: Callable[[int], str | None] | None = None):
        """`replace_replica(shard)`: with --replicas, start a backup in place of a dead replica of shard (its
        process name; None where none can be); experiments/launcher/replication.py."""
        self.cfg, self.out, self.started, self.kills, self.start = cfg, out, started, kills, start
        self.replace_replica = replace_replica
        self.enabled = cfg.checkpoints.every > 0
        self.asked = bool(self.enabled or kills.todo)  # whether the summary has `faults`
        self.done: list[dict] = []
        self.dead_replicas: list[dict] = []  # with --replicas: primaries and backups that died, not restarted

    def shard_settings(self, shard: int, base: ServerConfig) -> ServerConfig:
        """Shard `shard`'s config with the run's checkpoints (unchanged without them)."""
        if not self.enabled:
            return base
        return dataclasses.replace(base, checkpoint_dir=str(self.out / CHECKPOINTS),
                                   checkpoint_every=self.cfg.checkpoints.every)

    def recover(self, cluster, name: str) -> bool:
        """Restart process `name` if it is a shard this run can bring back; False: the run ends (the
        failure line then says what killed it)."""
        if name.startswith("worker-") and self.kills.said(name):  # killed on purpose: the others go on
            cluster.spared.add(name)
            return True
        if self.cfg.cluster.replicas and name.startswith(("server-", "backup-")):  # a backup takes over, or the
            cluster.spared.add(name)  # primary goes on without the dead backup (experiments/launcher/replication.py)
            replaced = self.replace_replica(int(name.split("-")[1])) if self.replace_replica is not None else None
            self.dead_replicas.append({"process": name, **how_ended(cluster.procs[name].returncode),
                                       "step": worker0_steps(self.out), "replaced_by": replaced,
                                       "wall_s": round(time.monotonic() - self.started, 3),
                                       "cause": self.kills.said(name) or ended(cluster.procs[name].returncode)})
            return True
        if not name.startswith("server-"):
            return False
        said = self.kills.said(name)
        code = cluster.procs[name].returncode
        shard = int(name.split("-", 1)[1])
        address = self._address(shard)
        lives = sum(1 for r in self.done if r["process"] == name)
        if not self.enabled or address is None or lives >= MAX_RESTARTS:
            why = ("without --checkpoint-every a dead shard ends the run" if not self.enabled else
                   "it died before it said its address, so no worker knows where it was" if address is None else
                   f"it was restarted {lives} times already, the most a run does")
            cluster.explain[name] = lambda code, s=said, w=why: (
                f"{name} (shard {shard}) " + (s or ended(code)) +
                f"; {w}; its output: {self.out / f'{name}.log'}")
            return False
        (self.out / f"{name}.log").rename(self.out / f"{name}.log.{lives + 1}")  # the dead life's log stays
        resumed = dataclasses.replace(self.shard_settings(shard, self.cfg.server_config(shard, bind=address)),
                                      resume=True)
        self.start(shard, resumed, self.out / f"{name}.addr")
        self.done.append({"process": name, "shard": shard, "exit_code": code, "address": address,
                          "step": worker0_steps(self.out), "wall_s": round(time.monotonic() - self.started, 3),
                          "cause": said or ended(code)})
        return True

    def _address(self, shard: int) -> str | None:
        try:
            return (self.out / f"server-{shard}.addr").read_text().strip() or None
        except FileNotFoundError:
            return None

    def summary(self, out: Path) -> dict:
        """summary.json's `faults`: the kills, the restarts, and for each restarted shard its lost clocks (a
        sync shard's updates since its last checkpoint: psrv/server/consistency/sync.py `skipped`), the
        version it resumed from, and its lost updates: how many fewer it applied than the shards that were
        never restarted (every push goes to every shard; in any mode; None if every shard was restarted)."""
        records = {}
        for path in out.glob("server-*.json"):
            try:
                record = json.loads(path.read_text())
                records[int(record["shard"])] = record
            except (ValueError, KeyError, TypeError):
                continue
        restarted = sorted({r["shard"] for r in self.done} & set(records))
        kept = [r["version"] for shard, r in records.items() if shard not in restarted]
        lost = {str(s): records[s].get("lost_clocks") for s in restarted}
        return {"kills": self.kills.done, "restarts": self.done, "checkpoint_every": self.cfg.checkpoints.every,
                **({"dead_replicas": self.dead_replicas} if self.cfg.cluster.replicas else {}),
                "lost_clocks": lost, "lost_clocks_total": sum(v or 0 for v in lost.values()),
                "resumed_from": {str(s): records[s].get("resumed_from") for s in restarted},
                "lost_updates": {str(s): max(kept) - records[s]["version"] if kept else None for s in restarted}}
