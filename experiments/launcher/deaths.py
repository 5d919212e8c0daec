"""Every death of a local run's process that no other record holds, and what it cost (killed from outside, crashed,
killed by --kill-worker or the nemesis): summary.json's `faults.deaths`; and a shipped-loop worker's death (any rank
but 0) survived where the mode allows (async, ssp, sync with backup workers), as under --kill-worker."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable

from psrv.config import RunConfig
from psrv.experiments.launcher.history.reading import HistoryError, read_log
from psrv.experiments.launcher.kills import ended, how_ended, worker0_steps

log = logging.getLogger("psrv.run")

BAD_INPUT = 2  # psrv's exit code for a ValueError (psrv/cli/main.py): every rank would fail alike


def survives_workers(cfg: RunConfig, *, script: bool) -> bool:
    """Whether the run goes on without a worker that dies: the shipped loop's workers (a script's run needs every
    rank's record) in async and ssp, which never wait for all, and in sync with backup workers, whose barrier
    needs N-b gradients, or a quorum, whose merges need Q workers of those still pushing; plain sync ends
    (its run would no longer be the one asked for: every rank's gradient in every clock)."""
    if script or cfg.is_allreduce:
        return False
    return cfg.mode in ("async", "ssp") or (cfg.mode == "sync" and (cfg.backup_workers > 0 or cfg.quorum > 0))


def last_clock(out: Path, rank: int, pid: int) -> int | None:
    """The clock of a worker life's last push that shard 0 acknowledged, from its history (docs/history.md:
    DIR/history/worker-R.PID.jsonl, written before each send, so a SIGKILL loses none); None without one."""
    path = out / "history" / f"worker-{rank}.{pid}.jsonl"
    try:
        life = read_log(path) if path.exists() else None
    except (HistoryError, OSError):
        return None
    if life is None:
        return None
    acked = {e["seq"] for e in life.events if e.ev == "ack" and e["shard"] == 0}
    return max((e["clock"] for e in life.events if e.ev == "push" and e["shard"] == 0 and e["seq"] in acked),
               default=None)


def _rank_steps(out: Path, name: str) -> int | None:
    """The steps a worker logged as its progress file last said (every 10 steps; psrv/client/steplog.py)."""
    try:
        return int((out / f"{name}.progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return None


def finished(out: Path, name: str) -> bool:
    """Whether worker `name`'s life ran to its end: its record (DIR/worker-R.json, the last thing a worker writes,
    after its final weights; a restart moves an earlier life's aside) is there, whole (not an interrupted or a
    failed one's). A SIGKILL cannot leave one; a worker killed or dead after writing it lost nothing."""
    try:
        record = json.loads((out / f"{name}.json").read_text())
    except (FileNotFoundError, ValueError):
        return False
    return isinstance(record, dict) and not record.get("interrupted") and not record.get("failed")


class Deaths:
    """The cluster's outermost `recover` (experiments/launcher/cluster.py): it asks `inner` (worker restarts, shard restarts,
    failovers) first, and records each death none of them records itself: a worker left behind (killed by
    --kill-worker, or survived here), and the death that ends the run; a worker that dies after its last step (its
    record whole) is recorded `finished` and costs nothing, restarts on or off. `done`: summary.json's
    `faults.deaths`. `said(name, pid)`: what killed `name` (its life `pid`) on purpose (--kill-*, the nemesis), ''
    for a death from outside or a crash; `restarted()`: the ranks --restart-workers brought back (their later lives are not survived here); `steps`:
    each rank's steps asked for (None: a script's, not said)."""

    def __init__(self, cfg: RunConfig, out: Path, started: float, *, script: bool, steps: int | None,
                 said: Callable[[str, int], str], restarted: Callable[[], set[int]]):
        self.cfg, self.out, self.started, self.said, self.restarted = cfg, out, started, said, restarted
        self.survives = survives_workers(cfg, script=script)
        self.steps = steps
        self.done: list[dict] = []

    def recover_or(self, inner: Callable) -> Callable:
        def recover(cluster, name: str) -> bool:
            proc = cluster.procs[name]
            if name.startswith("worker-") and finished(self.out, name):  # after its last step: nothing to recover
                cluster.spared.add(name)
                entry = self._record(cluster, name, survived=True, finished=True)
                log.info("%s %s after its last step (its record is whole): nothing was lost", name, entry["cause"])
                return True
            if inner(cluster, name):
                if name.startswith("worker-") and cluster.procs[name] is proc:  # left behind, not restarted
                    self._record(cluster, name, survived=True)
                return True
            if self._survivable(cluster, name):
                cluster.spared.add(name)
                entry = self._record(cluster, name, survived=True)
                log.warning("%s %s at worker 0's step %d; the run goes on without it (%s)", name, entry["cause"],
                            entry["step"], self.cfg.mode if self.cfg.mode != "sync" else "sync with backup workers")
                return True
            self._record(cluster, name, survived=False)
            return False
        return recover

    def _survivable(self, cluster, name: str) -> bool:
        """A shipped loop's worker other than rank 0 (it writes the final weights: as for --kill-worker, its death
        ends the run), not restarted before, dead of anything but bad input, with another worker still running."""
        if not (self.survives and name.startswith("worker-")) or cluster.procs[name].returncode == BAD_INPUT:
            return False
        rank = int(name.split("-", 1)[1])
        if rank == 0 or rank in self.restarted():
            return False
        return any(p.poll() is None for n, p in cluster.procs.items() if n.startswith("worker-") and n != name)

    def _record(self, cluster, name: str, *, survived: bool, finished: bool = False) -> dict:
        proc = cluster.procs[name]
        entry = {"process": name, **how_ended(proc.returncode), "step": worker0_steps(self.out),
                 "wall_s": round(time.monotonic() - self.started, 3),
                 "cause": self.said(name, proc.pid) or ended(proc.returncode), "survived": survived,
                 **({"finished": True} if finished else {})}
        if name.startswith("worker-") and name[len("worker-"):].isdigit():  # a shipped loop's or a script's rank
            rank = int(name.split("-", 1)[1])
            steps, clock = _rank_steps(self.out, name), last_clock(self.out, rank, proc.pid)
            # the steps up to its last acknowledged push (a clock covers `local_steps` steps: a restarted life began
            # at a clock's first step, so its own count, `rank_steps`, is not the rank's)
            per = self.cfg.worker.local_steps
            done = self.steps if finished else (clock + 1) * per if clock is not None and isinstance(per, int) \
                else steps
            entry.update(rank=rank, rank_steps=steps, last_clock=clock,
                         steps_not_done=None if self.steps is None or done is None else max(0, self.steps - done))
        self.done.append(entry)
        return entry

    @property
    def ranks(self) -> set[int]:
        """The ranks that died and were left behind: they write no record, and the run went on without them (not
        those that died after their last step, whose record is written)."""
        return {d["rank"] for d in self.done if d["survived"] and "rank" in d and not d.get("finished")}
