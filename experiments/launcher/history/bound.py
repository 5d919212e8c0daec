"""Rule 4, the ssp bound: a pull for clock c is answered only while c - min(clock of the active workers) <= s,
both rebuilt from the answering replica's own lineage (psrv/server/consistency/ssp.py's pull_ready)."""
from __future__ import annotations

from psrv.experiments.launcher.history.reading import Event
from psrv.experiments.launcher.history.replay import Membership
from psrv.experiments.launcher.history.result import Violation


def check(shard: int, lineage: list[Event], *, workers: int, staleness: int) -> list[Violation]:
    members, found = Membership(workers), []
    for e in lineage:
        members.see(e)
        if e.ev != "answer":
            continue
        lowest, slowest = members.slowest()
        if e["clock"] - lowest > staleness:
            who = f"worker {slowest}" if slowest is not None else "no worker active"
            found.append(Violation.at(4, e, f"shard {shard} answers worker {e['w']}'s pull for clock {e['clock']} "
                                      f"while the slowest active worker ({who}) is at clock {lowest}: "
                                      f"{e['clock'] - lowest} ahead, and the bound is {staleness}"))
    return found
