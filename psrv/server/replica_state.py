"""What a joining backup is sent (docs/reliability.md, "Joining"): the shard's checkpoint state (streaming
DiLoCo's per-fragment optimizers among it), and what a checkpoint leaves out but a backup must hold to go on
as its primary would: the workers' compressed-pull copies, the pulls waiting for their answer, the counters,
who holds each rank, the workers' step speeds. A mixin of ShardService (psrv/server/service.py), whose parts
it reads: shard, pulls, pending, stats, sessions, speeds, and state_dict/load_state_dict."""
from __future__ import annotations


class ReplicaState:
    def replica_state(self) -> dict | None:
        """The state a joining backup starts from; None while the shard has none (before the first HELLO)."""
        if self.shard is None:
            return None
        return {**self.state_dict(), "pulls": self.pulls.state_dict(),
                "pending": self.pending.state_dict(), "stats": self.stats.state_dict(),
                "sessions": self.sessions.state_dict(), "speeds": dict(self.speeds.seconds)}

    def load_replica_state(self, state: dict | None, *, source: str) -> None:
        """Carry on from a primary's replica_state (nothing to load while it had none)."""
        if state is None:
            return
        state = dict(state)
        extra = {k: state.pop(k, None) for k in ("pulls", "pending", "stats", "sessions", "speeds")}
        self.load_state_dict(state, source=source)
        self.resumed_from = None  # a backup carries the shard on; it did not resume a checkpoint
        if extra["pulls"] is not None:
            self.pulls.load_state_dict(extra["pulls"], self.shard.size, self.shard.device)
        if extra["pending"] is not None:
            self.pending.load_state_dict(extra["pending"], received=self.now())
        if extra["stats"] is not None:
            self.stats.load_state_dict(extra["stats"])
        if extra["sessions"] is not None:
            self.sessions.load_state_dict(extra["sessions"])
        if extra["speeds"] is not None:
            self.speeds.seconds = {int(w): float(v) for w, v in extra["speeds"].items()}
