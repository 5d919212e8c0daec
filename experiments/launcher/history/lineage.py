"""A shard's replicas, its final replica, and the lineage of each: the events whose effects its state holds,
followed back through every `state` it loaded to the `sent_state` of the replica that sent it."""
from __future__ import annotations

from dataclasses import dataclass, field

from psrv.experiments.launcher.history.reading import Event, HistoryError, ProcessLog


def _standing(log: ProcessLog) -> tuple:
    """How late a replica served: its highest epoch, as primary before as backup, the later beginning first.
    A replica that recorded no epoch ranks below every one that did, by its start."""
    served = [(e["epoch"], e["role"] == "primary", e.t) for e in log.events if e.ev == "epoch"]
    return max(served, default=(-1, log.role == "primary", log.started))


@dataclass
class ShardHistory:
    """Shard `shard`'s replica lives, each a ProcessLog, and the one whose state is the shard's at the end."""
    shard: int
    replicas: list[ProcessLog]
    final: ProcessLog = field(init=False)
    _lineages: dict[str, list[Event]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        # the replica that served the highest epoch; as primary rather than following it as a backup; of two
        # primaries of one epoch (rule 2 reports them) the one that began it later, which served it last
        self.final = max(self.replicas, key=_standing)

    def lineage(self, replica: ProcessLog | None = None) -> list[Event]:
        """The events `replica` (default: the final one) holds the effects of, oldest first."""
        replica = replica or self.final
        if replica.file not in self._lineages:
            self._lineages[replica.file] = self._upto(replica, len(replica.events) - 1, set())
        return self._lineages[replica.file]

    def _upto(self, replica: ProcessLog, last: int, seen: set) -> list[Event]:
        """`replica`'s lineage through its event at index `last`: what its latest `state` up to there brought,
        then its own events after it (a state loaded replaces whatever the replica held before)."""
        if (replica.file, last) in seen:
            raise HistoryError(f"{replica.events[last].where}: the `state` and `sent_state` links go round in a "
                               "circle: the history is corrupt")
        seen.add((replica.file, last))
        own = replica.events[:last + 1]
        loaded = next((i for i in range(len(own) - 1, -1, -1) if own[i].ev == "state"), None)
        if loaded is None:
            return own
        sender, sent = self._sender(replica, own[loaded])
        return self._upto(sender, sent, seen) + own[loaded:]

    def _sender(self, replica: ProcessLog, state: Event) -> tuple[ProcessLog, int]:
        """The replica and index of the `sent_state` that `state` loaded: to this replica's address, at the same
        op number (and epoch, where both say one), from a replica at `from`; of several, the last sent before it."""
        found = []
        for other in self.replicas:
            if other is replica or other.address != state["from"]:
                continue
            for i, e in enumerate(other.events):
                if (e.ev == "sent_state" and e["to"] == replica.address and e["n"] == state["n"]
                        and (e.get("epoch") is None or state.get("epoch") is None or e["epoch"] == state["epoch"])):
                    found.append((e.t <= state.t, e.t, other, i))
        if not found:
            raise HistoryError(f"{state.where}: {replica.file} loaded a state from {state['from']} at op "
                               f"{state['n']} that no file of shard {self.shard} records sending (a `sent_state` to "
                               f"{replica.address}): the history is incomplete")
        _, _, sender, index = max(found, key=lambda f: (f[0], f[1]))
        return sender, index


def shard_histories(logs: list[ProcessLog], servers: int) -> dict[int, ShardHistory]:
    """Every shard's ShardHistory; HistoryError if a shard of the run (0..servers-1) recorded nothing,
    or a file names a shard the run does not have."""
    by_shard: dict[int, list[ProcessLog]] = {}
    for log in logs:
        if not log.is_worker:
            by_shard.setdefault(log.shard, []).append(log)
    extra = sorted(set(by_shard) - set(range(servers)))
    if extra:
        raise HistoryError(f"history files of shard {extra[0]}, which the run does not have (cluster.servers = "
                           f"{servers}): is this the history of another run?")
    missing = [k for k in range(servers) if k not in by_shard]
    if missing:
        raise HistoryError(f"no replica of shard {missing[0]} recorded a history (no shard-{missing[0]}.*.jsonl "
                           "with a whole line): the history is incomplete")
    return {k: ShardHistory(k, by_shard[k]) for k in range(servers)}
