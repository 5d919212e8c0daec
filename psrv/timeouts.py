"""Every failover timeout from one failure bound F (`--failure-bound`, docs/reliability.md "Timeouts"), and the
order they must keep: a replica's peers count it failed after silence of about F, and a worker must not be
dropped from a shard while it is finding the shard's next primary."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timeouts:
    bound: float                  # F
    worker: float                 # --worker-timeout: a shard drops a worker silent this long
    transport_floor: float = 0.0  # a transport's own least silence (torch RPC's first ops arrive late)
    request: float | None = None  # --request-timeout: a worker gives up on a silent shard (where known: psrv run)

    @property
    def ping_every(self) -> float:
        """A primary pings an idle replication stream this often."""
        return self.bound / 10

    @property
    def silence(self) -> float:
        """A backup claims the shard after this long without a word from its primary."""
        return max(self.bound / 2, self.transport_floor)

    @property
    def ack_timeout(self) -> float:
        """A primary drops (at a new epoch, psrv/server/replication/witness.py) a backup silent this long on an op
        (every push waits for every backup's ack, so this is what a stalled backup costs the shard at most)."""
        return max(self.bound, self.transport_floor)

    @property
    def probe_after(self) -> float:
        """A worker probes a replicated shard that has not answered this long (then its next replica after
        twice as long again without an answer to the probe)."""
        return self.bound / 5

    @property
    def fenced_linger(self) -> float:
        """A fenced primary answers NOT_PRIMARY (naming the shard's replicas now) this long before it ends: a worker
        tries each replica it knows (at most five) after 3F/5 without an answer, so one that knew of no other live
        replica comes back here within 3F and hears where the shard went."""
        return 5 * self.bound

    def check(self) -> None:
        """ValueError, naming the settings, when the order fails: a worker dropped while it fails over."""
        failover = self.silence + 3 * self.probe_after
        if not failover < self.worker / 2:
            raise ValueError(f"--failure-bound {self.bound:g}s makes a failover take up to {failover:g}s, which must "
                             f"stay below half of --worker-timeout ({self.worker:g}s): a shard would drop workers "
                             f"busy finding its next primary; lower --failure-bound or raise --worker-timeout")
        if self.request is not None and not failover < self.request:
            raise ValueError(f"--request-timeout {self.request:g}s must exceed a failover ({failover:g}s with "
                             f"--failure-bound {self.bound:g}s): a worker would give up on a shard while its backup "
                             f"takes over")

    def line(self) -> str:
        """The derived timeouts and the order checked, as psrv run and psrv serve print them at start."""
        failover = self.silence + 3 * self.probe_after
        return (f"timeouts from --failure-bound {self.bound:g}s: the primary pings every {self.ping_every:g}s, a "
                f"backup takes over after {self.silence:g}s of silence, a worker probes after {self.probe_after:g}s "
                f"and tries the next replica at {3 * self.probe_after:g}s, a backup is dropped after "
                f"{self.ack_timeout:g}s without an ack; a failover ({failover:g}s) < --worker-timeout / 2 "
                f"({self.worker / 2:g}s)")
