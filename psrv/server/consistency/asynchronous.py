"""ASP: every push is applied at once; every pull returns the current weights."""
from psrv.server.consistency.base import Controller, Decision


class AsyncController(Controller):
    mode = "async"

    def _decide(self, worker: int, clock: int, age: int) -> Decision:
        return Decision.APPLY

    def pull_ready(self, worker: int, clock: int) -> bool:
        return True
