"""Rule 5, the counts: each DIR/server-K.json's `pushes`, `updates_applied` and `version`, and summary.json's
`pushes`, `updates_applied` and `updates_applied_per_shard`, against what the shards' final lineages hold.

What they count (psrv/server/counters.py, experiments/launcher/summary.py): a shard's `pushes` are the pushes it
settled, applied or dropped, each once; `updates_applied` its optimizer steps (async and ssp: one per push applied;
sync: one per clock committed with a gradient in it, a quorum's merge too, or as many as an older history's merge of
fragments says, `updates`); `version` the version after its last step. summary.json's `pushes` are the workers' steps
that pushed, so every one of them settled once on each shard: it is held against shard 0's, and only for a complete
run in which no worker life died (--kill-worker, the nemesis's kill, a restart: the summary leaves out the steps of
a life that wrote no record)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from psrv.config import RunConfig
from psrv.experiments.launcher.history.lineage import ShardHistory
from psrv.experiments.launcher.history.reading import Event, HistoryError
from psrv.experiments.launcher.history.result import Violation


@dataclass(frozen=True)
class Held:
    """What one lineage holds, counted the way the shard's own record counts."""
    pushes: int
    updates_applied: int
    version: int


def held(lineage: list[Event], mode: str) -> Held:
    pushes = sum(e.ev in ("apply", "drop") for e in lineage)
    if mode == "sync":
        updates = sum(e.fields.get("updates", 1) for e in lineage if e.ev == "commit" and e["pushed"])
    else:
        updates = sum(e.ev == "apply" for e in lineage)
    version = next((e["version"] for e in reversed(lineage) if e.ev in ("apply", "commit")), 0)
    return Held(pushes, updates, version)


def _record(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise HistoryError(f"{path} does not parse ({exc})") from None


def _differs(file: str, key: str, said, lineage: str, holds) -> Violation:
    return Violation(5, file, None, f"`{key}` is {said}, but {lineage} holds {holds}")


def _lost_a_life(faults: dict) -> bool:
    """Whether a worker life ended without its record: one the nemesis killed, any that psrv run restarted, or one
    whose death it recorded (experiments/launcher/deaths.py: killed from outside, crashed)."""
    nemesis = (faults.get("nemesis") or {}).get("faults", [])
    return bool(faults.get("worker_restarts")) or any("rank" in d for d in faults.get("deaths", [])) or any(
        f["kind"] == "kill" and f["done"] and f["target"].startswith("worker") for f in nemesis)


def check(run: Path, cfg: RunConfig, shards: dict[int, ShardHistory]) -> tuple[list[Violation], list[str]]:
    """The differences, and the comparisons skipped with why."""
    found, skipped = [], []
    have = {k: held(h.lineage(), cfg.mode) for k, h in shards.items()}
    for k, h in shards.items():
        record = _record(run / f"server-{k}.json")
        if record is None:
            skipped.append(f"server-{k}.json: none in the run folder")
            continue
        name = f"shard {k}'s final lineage (ending in {h.final.file})"
        for key in ("pushes", "updates_applied", "version"):
            if key in record and record[key] != getattr(have[k], key):
                found.append(_differs(f"server-{k}.json", key, record[key], name, getattr(have[k], key)))
    summary = _record(run / "summary.json")
    if summary is None:
        skipped.append("summary.json: none in the run folder")
        return found, skipped
    first = f"shard 0's final lineage (ending in {shards[0].final.file})"
    if "updates_applied" in summary and summary["updates_applied"] != have[0].updates_applied:
        found.append(_differs("summary.json", "updates_applied", summary["updates_applied"], first,
                              have[0].updates_applied))
    per_shard = [have[k].updates_applied for k in sorted(have)]
    if "updates_applied_per_shard" in summary and summary["updates_applied_per_shard"] != per_shard:
        found.append(_differs("summary.json", "updates_applied_per_shard", summary["updates_applied_per_shard"],
                              "the shards' final lineages", per_shard))
    if not summary.get("complete", True) or cfg.kill.worker or _lost_a_life(summary.get("faults") or {}):
        skipped.append("summary.json `pushes`: the run was interrupted or a worker died (killed, or restarted), and "
                       "the summary leaves out the steps it did not record")
    elif "pushes" in summary and summary["pushes"] != have[0].pushes:
        found.append(_differs("summary.json", "pushes", summary["pushes"], first, have[0].pushes))
    return found, skipped
