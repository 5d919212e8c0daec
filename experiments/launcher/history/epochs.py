"""Rule 2, no split brain: epochs begin in increasing order of time, one replica acknowledges per epoch and none
after it was fenced, what any replica acknowledged is in the final lineage, and no worker goes back an epoch."""
from __future__ import annotations

from psrv.experiments.launcher.history.lineage import ShardHistory
from psrv.experiments.launcher.history.reading import Event, ProcessLog
from psrv.experiments.launcher.history.result import Violation
from psrv.experiments.launcher.history.writes import settled


def _in_time(events: list[Event]) -> list[Event]:
    return sorted(events, key=lambda e: (e.t, e.file, e.line))


def primary_epochs(history: ShardHistory) -> list[Event]:
    """The `epoch` events of shard's replicas beginning an epoch as its primary, in time order."""
    return _in_time([e for r in history.replicas for e in r.events if e.ev == "epoch" and e["role"] == "primary"])


def _epochs_increase(k: int, history: ShardHistory) -> list[Violation]:
    """A replica life may say its epoch again (its configuration changed); another may only begin a higher one."""
    found, top = [], None
    for e in primary_epochs(history):
        if top is not None and (e["epoch"] < top["epoch"] or (e["epoch"] == top["epoch"] and e.file != top.file)):
            what = "two primaries in one epoch" if e["epoch"] == top["epoch"] else "an epoch begun out of order"
            found.append(Violation.at(2, e, f"shard {k}: {e.file} begins epoch {e['epoch']} as primary after "
                                      f"{top.file} began epoch {top['epoch']} at {top.where} ({what})"))
        if top is None or e["epoch"] >= top["epoch"]:
            top = e
    return found


def _one_acknowledger(k: int, history: ShardHistory) -> list[Violation]:
    found, first, reported = [], {}, set()
    acks = _in_time([e for r in history.replicas for e in r.events if e.ev == "ack"])
    for e in acks:
        epoch = e["epoch"]
        other = first.setdefault(epoch, e)
        if other.file != e.file and (epoch, e.file) not in reported:
            reported.add((epoch, e.file))
            found.append(Violation.at(2, e, f"shard {k}: {e.file} acknowledges in epoch {epoch}, in which "
                                      f"{other.file} acknowledged first (at {other.where}): two acknowledgers "
                                      "in one epoch"))
    return found


def _none_after_fenced(k: int, replica: ProcessLog) -> list[Violation]:
    found, fenced = [], None
    for e in replica.events:
        if e.ev == "fenced":
            fenced = e
        elif e.ev == "ack" and fenced is not None and e["epoch"] < fenced["epoch"]:
            found.append(Violation.at(2, e, f"shard {k}: {replica.file} acknowledges in epoch {e['epoch']} after "
                                      f"it learned at {fenced.where} that epoch {fenced['epoch']} has a primary"))
    return found


def _acknowledged_kept(k: int, history: ShardHistory) -> list[Violation]:
    """What a replica other than the final one acknowledged must be in the final lineage (the final one's own
    acknowledgements are rule 1's, through the workers that took them)."""
    applied, dropped = settled(history.lineage())
    found = []
    for replica in history.replicas:
        if replica is history.final:
            continue
        for e in replica.events:
            if e.ev == "ack" and (e["w"], e["seq"]) not in applied and (e["w"], e["seq"]) not in dropped:
                found.append(Violation.at(2, e, f"shard {k}: {replica.file} acknowledged worker {e['w']}'s push "
                                          f"seq {e['seq']} in epoch {e['epoch']}, and the final lineage (ending in "
                                          f"{history.final.file}) does not hold it"))
    return found


def _workers_go_forward(workers: list[ProcessLog]) -> list[Violation]:
    """Per worker rank and shard, over all its lives in time order: the epochs of the answers it took."""
    found, latest = [], {}
    answers = _in_time([e for log in workers for e in log.events if e.ev in ("ack", "pull")])
    for e in answers:
        key = (e["w"], e["shard"])
        before = latest.get(key)
        if before is not None and e["epoch"] < before["epoch"]:
            found.append(Violation.at(2, e, f"worker {e['w']} takes an answer from epoch {e['epoch']} of shard "
                                      f"{e['shard']} after one from epoch {before['epoch']} (at {before.where})"))
        elif before is None or e["epoch"] > before["epoch"]:
            latest[key] = e
    return found


def check(shards: dict[int, ShardHistory], workers: list[ProcessLog]) -> list[Violation]:
    found = _workers_go_forward(workers)
    for k, history in shards.items():
        found += _epochs_increase(k, history) + _one_acknowledger(k, history) + _acknowledged_kept(k, history)
        for replica in history.replicas:
            found += _none_after_fenced(k, replica)
    return found
