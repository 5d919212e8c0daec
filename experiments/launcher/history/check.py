"""`check_run(DIR)`: a run folder's history held against rules 1-5 of docs/history.md, as a CheckResult."""
from __future__ import annotations

from pathlib import Path

from psrv.config import MODES
from psrv.experiments.launcher.history import barrier, bound, counts, epochs, writes
from psrv.experiments.launcher.history.lineage import shard_histories
from psrv.experiments.launcher.history.reading import HistoryError, ProcessLog, read_history
from psrv.experiments.launcher.history.result import CheckResult, Counts, Violation
from psrv.experiments.launcher.provenance import stored_config


def _workers_in_range(workers: list[ProcessLog], servers: int) -> None:
    for log in workers:
        for e in log.events:
            if e.ev in ("push", "ack", "pull") and not 0 <= e["shard"] < servers:
                raise HistoryError(f"{e.where}: a `{e.ev}` to shard {e['shard']}, which the run does not have "
                                   f"(cluster.servers = {servers}): is this the history of another run?")


def _first_once(found: list[Violation]) -> list[Violation]:
    """Each violation once (replicas share their lineages' beginnings), first in time first."""
    unique = {(v.rule, v.file, v.line, v.message): v for v in found}
    return sorted(unique.values(), key=Violation.sort_key)


def check_run(run: str | Path) -> CheckResult:
    """Check DIR/history against DIR/config.json's run and its records. HistoryError (a ValueError) when
    there is nothing to check: not a run folder, a mode without shards, no history, or a corrupt one."""
    run = Path(run)
    if not run.is_dir():
        raise HistoryError(f"{run} is not a folder; give a run folder (psrv run --out DIR)")
    try:
        cfg = stored_config(run)
    except ValueError as exc:
        raise HistoryError(f"{run} is not a run folder: {exc}") from None
    if cfg.mode not in MODES:
        raise HistoryError(f"{run} ran mode {cfg.mode!r}, which has no parameter server: no history to check")
    logs = read_history(run / "history")
    shards = shard_histories(logs, cfg.cluster.servers)
    workers = [log for log in logs if log.is_worker]
    _workers_in_range(workers, cfg.cluster.servers)
    found = writes.check(shards, workers) + epochs.check(shards, workers)
    commits = 0
    for k, history in shards.items():
        for replica in history.replicas:  # each replica's own state: what it committed and answered from
            lineage = history.lineage(replica)
            if cfg.mode == "sync":
                broken, n = barrier.check(k, lineage, workers=cfg.cluster.workers, backup_workers=cfg.backup_workers,
                                          quorum=cfg.quorum, quorum_max_age=cfg.quorum_max_age,
                                          quorum_grace=cfg.quorum_grace, quorum_wait=cfg.quorum_wait)
                found += broken
                commits += n if replica is history.final else 0
            elif cfg.mode == "ssp":
                found += bound.check(k, lineage, workers=cfg.cluster.workers, staleness=cfg.staleness)
    differ, skipped = counts.check(run, cfg, shards)
    tally = Counts(
        acknowledged=sum(e.ev == "ack" and e["dropped"] is None for log in workers for e in log.events),
        applied=sum(e.ev == "apply" for h in shards.values() for e in h.lineage()),
        replicas=sum(len(h.replicas) for h in shards.values()),
        epochs=len({(k, e["epoch"]) for k, h in shards.items() for e in epochs.primary_epochs(h)}),
        commits=commits,
        answered=sum(e.ev == "answer" for h in shards.values() for r in h.replicas for e in r.events))
    return CheckResult(str(run), cfg.mode, tally, _first_once(found + differ), skipped)
