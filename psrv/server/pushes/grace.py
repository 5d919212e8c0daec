"""A quorum's grace window (`--quorum-grace SECONDS`, psrv/server/consistency/quorum.py): once the open merge has
its Q workers, it waits up to SECONDS for the others' pushes. Time is read by the primary alone, as each
replicated request arrives (ShardService._judge sends `merge_due` with it in the stream): the window closes at
the first request after it is over, on the primary and on every backup alike, never in between. A merge whose
window is over closes before that request is handled, so a push arriving then joins the next merge."""
from __future__ import annotations

from psrv.server.state import ShardState


class GraceWindow:
    def __init__(self, state: ShardState):
        self.state = state
        self.seconds = state.cfg.quorum_grace if state.cfg.quorum else 0.0
        self.since: float | None = None  # when the open merge had its Q workers (the primary's clock)

    def due(self) -> bool:
        """The primary's judgement for the request in hand: is the open merge's window over?"""
        return self.since is not None and self.state.now() - self.since >= self.seconds

    def judged(self) -> dict:
        return {"merge_due": self.due()} if self.seconds else {}

    def opened(self) -> None:
        """The open merge was looked at and stays open: its window starts once it has its Q workers."""
        c = self.state.controller
        if self.seconds and self.since is None and c.met():
            self.since = self.state.now()

    def closed(self) -> None:
        self.since = None

    def take(self, judged: dict | None) -> bool:
        """The request in hand's judgement, before it is handled: True where it ends the open merge's window."""
        if not self.seconds or not judged or not judged.get("merge_due"):
            return False
        self.state.controller.expire()
        return True
