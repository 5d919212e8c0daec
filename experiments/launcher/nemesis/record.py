"""The nemesis's record: every fault as it was done, appended to DIR/nemesis.jsonl when it is done (a line
with "ev": "fault") and when it is healed (a line with "ev": "healed", the same "id"), and the block that
summary.json keeps under faults.nemesis (`Record.summary`)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

JOURNAL = "nemesis.jsonl"


class Record:
    """One run's faults, numbered from 1 in the order they were done. Times: `wall_s`, seconds since the
    launcher started; `t`, time.monotonic() (the clock of the processes' histories, docs/history.md);
    `step`, worker 0's steps as its progress file said."""

    def __init__(self, out: Path, started: float):
        self.path, self.started = out / JOURNAL, started
        self.faults: list[dict] = []

    @property
    def next_id(self) -> int:
        """The number the next fault gets."""
        return len(self.faults) + 1

    def _now(self, step: int) -> dict:
        now = time.monotonic()
        return {"wall_s": round(now - self.started, 3), "t": now, "step": step}

    def _append(self, line: dict) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())  # one write: a line is whole or absent
        finally:
            os.close(fd)

    def fault(self, *, kind: str, target: str, at: str, duration: float, processes: list[str],
              pids: list[int], step: int, done: bool, why: str = "", **more) -> dict:
        """A fault done (or not: `why`), now; its entry, which `healed` completes."""
        entry = {"id": self.next_id, "kind": kind, "target": target, "at": at, "processes": processes,
                 "pids": pids, "duration_s": duration, **self._now(step), "done": done,
                 **({"why": why} if why else {}), **more}
        self.faults.append(entry)
        self._append({"ev": "fault", **entry})
        return entry

    def healed(self, entry: dict, *, step: int, why: str | None = None) -> None:
        """Fault `entry` undone now (a process continued, routes removed, the disk freed); `why`: why it could
        not be (the process had ended meanwhile, ...)."""
        now = self._now(step)
        entry.update({f"healed_{k}": v for k, v in now.items()}, healed=why is None,
                     **({"heal_why": why} if why else {}))
        self._append({"ev": "healed", "id": entry["id"], **now, "healed": why is None,
                      **({"why": why} if why else {})})

    def summary(self, *, schedule: str, seed: int, not_reached: list[str]) -> dict:
        """summary.json's faults.nemesis: the schedule, every fault, counts by kind and by target, and the
        fixed faults whose time never came (the run ended first)."""
        by_kind: dict[str, dict[str, int]] = {}
        by_target: dict[str, dict[str, int]] = {}
        for f in self.faults:
            for table, key in ((by_kind, f["kind"]), (by_target, f["target"] or "disk")):
                counts = table.setdefault(key, {"done": 0, "not_done": 0})
                counts["done" if f["done"] else "not_done"] += 1
        done = sum(f["done"] for f in self.faults)
        return {"schedule": schedule, "seed": seed, "journal": JOURNAL, "faults": self.faults, "done": done,
                "not_done": len(self.faults) - done, "by_kind": by_kind, "by_target": by_target,
                "not_reached": not_reached}
