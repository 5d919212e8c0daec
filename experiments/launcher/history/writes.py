"""Rule 1, nothing lost and nothing twice: every push a worker took an answer for that did not say dropped
is applied exactly once in its shard's final lineage, and nothing is applied there that no worker sent."""
from __future__ import annotations

from psrv.experiments.launcher.history.lineage import ShardHistory
from psrv.experiments.launcher.history.reading import Event, ProcessLog
from psrv.experiments.launcher.history.result import Violation


def settled(lineage: list[Event]) -> tuple[dict[tuple, Event], dict[tuple, Event]]:
    """The pushes a lineage applied and dropped, by (worker, seq): each one's first `apply` or `drop`."""
    applied: dict[tuple, Event] = {}
    dropped: dict[tuple, Event] = {}
    for e in lineage:
        if e.ev == "apply":
            applied.setdefault((e["w"], e["seq"]), e)
        elif e.ev == "drop":
            dropped.setdefault((e["w"], e["seq"]), e)
    return applied, dropped


def check(shards: dict[int, ShardHistory], workers: list[ProcessLog]) -> list[Violation]:
    sent = {(e["w"], e["seq"], e["shard"]) for log in workers for e in log.events if e.ev == "push"}
    found = []
    for k, history in shards.items():
        seen: dict[tuple, Event] = {}
        for e in history.lineage():
            if e.ev != "apply":
                continue
            key = (e["w"], e["seq"])
            if key in seen:
                found.append(Violation.at(1, e, f"shard {k} applies worker {key[0]}'s push seq {key[1]} a second "
                                          f"time in its final lineage (first at {seen[key].where})"))
            else:
                seen[key] = e
            if (*key, k) not in sent:
                found.append(Violation.at(1, e, f"shard {k} applies a push of worker {key[0]} seq {key[1]} that "
                                          "no worker recorded sending (no `push` event)"))
    applied = {k: settled(h.lineage()) for k, h in shards.items()}
    for log in workers:
        for e in log.events:
            if e.ev != "ack" or e["dropped"] is not None:
                continue
            k, key = e["shard"], (e["w"], e["seq"])
            done, dropped = applied[k]
            if key in done:
                continue
            fate = (f"dropped it ({dropped[key]['why']}) at {dropped[key].where}" if key in dropped
                    else "never applied it")
            found.append(Violation.at(1, e, f"worker {key[0]} took an answer for its push seq {key[1]} to shard {k} "
                                      f"that did not say dropped, and shard {k}'s final lineage (ending in "
                                      f"{shards[k].final.file}) {fate}: an acknowledged write is lost"))
    return found
