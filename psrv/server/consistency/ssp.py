"""SSP(s): pushes apply at once; a pull at clock c waits until c - (slowest active clock) <= s."""
from psrv.server.consistency.base import Controller, Decision


class SSPController(Controller):
    mode = "ssp"

    def __init__(self, num_workers: int, *, staleness: int):
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0; got {staleness}")
        super().__init__(num_workers)
        self.staleness = staleness

    def _decide(self, worker: int, clock: int, age: int) -> Decision:
        return Decision.APPLY

    def pull_ready(self, worker: int, clock: int) -> bool:
        return clock - self.min_clock() <= self.staleness
