"""What a shard says of itself: its answer to STATS (psrv top, psrv admin), what `psrv serve --out` writes
and what a run's summary holds: the job, the shard's version and clocks, its checkpoints, its place among its
replicas, and the counters (psrv/server/counters.py)."""
from __future__ import annotations

from psrv.protocol import Message, MsgType
from psrv.server.state import ShardState


class Stats:
    """`service`: the ShardService (psrv/server/service.py) whose `reply`, `checkpoints` and `replication` it
    reads."""

    def __init__(self, state: ShardState, service):
        self.state = state
        self.service = service

    def on_stats(self, peer, msg: Message) -> None:
        self.service.reply(peer, Message(MsgType.STATS, seq=msg.seq, fields=self.summary()))

    def rule_counts(self) -> dict[str, int]:
        """What the update rule did on this shard and its fragments (UpdateRule.counts; {} for most rules)."""
        s = self.state
        counts = s.fragments.rule_counts()
        if s.shard is not None:
            counts.update(s.shard.rule.counts())
        return dict(sorted(counts.items()))

    def summary(self) -> dict:
        s, replication = self.state, self.service.replication
        cfg, c = s.cfg, s.controller
        return {"shard": cfg.shard, "num_shards": cfg.num_shards, "mode": cfg.mode,
                "update_rule": cfg.optimizer.update_rule, "rule_counts": self.rule_counts(), "staleness": cfg.staleness, "workers": cfg.workers,
                "version": s.shard.version if s.shard else 0, "plan_hash": s.plan_hash,
                "active": sorted(c.active), "clocks": {str(w): n for w, n in c.clocks.items()},
                "resumed_from": s.resumed_from, "lost_clocks": c.skipped,
                **self.service.checkpoints.summary(),
                "payload_bytes": dict(getattr(s.transport, "payload_bytes", {})),  # by data path
                "role": "backup" if replication.follower is not None else "primary",
                "epoch": replication.epoch,
                "address": getattr(s.transport, "address", None),
                "backups": [b.address for b in replication.replicas.backups], "failovers": replication.failovers,
                "fenced": replication.replicas.fenced,
                **s.stats.to_dict()}
