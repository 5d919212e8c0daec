"""BSP: gradients of clock c are buffered; when every active worker's (or N-b with backup
workers) is in, the shard applies their mean as ONE step and pulls for c+1 are answered."""
from psrv.server.consistency.base import Controller, Decision


class SyncController(Controller):
    mode = "sync"

    def __init__(self, num_workers: int, *, backup_workers: int = 0):
        if not 0 <= backup_workers < num_workers:
            raise ValueError(f"backup_workers must be in [0, {num_workers}); got {backup_workers}")
        super().__init__(num_workers)
        self.backup_workers = backup_workers
        self.open_clock = 0           # clocks committed so far == updates applied
        self.arrived: set[int] = set()

    def _decide(self, worker: int, clock: int) -> Decision:
        if clock != self.open_clock or worker in self.arrived:
            return Decision.DROP
        self.arrived.add(worker)
        return Decision.ACCUMULATE

    def needed(self) -> int:
        return max(1, len(self.active) - self.backup_workers)

    def commit_ready(self) -> bool:
        if not self.arrived:
            return False
        return len(self.arrived) >= self.needed() or self.active <= self.arrived

    def committed(self) -> None:
        self.open_clock += 1
        self.arrived = set()

    def pull_ready(self, worker: int, clock: int) -> bool:
        return clock <= self.open_clock

    def next_clock(self, worker: int) -> int:
        return self.open_clock
