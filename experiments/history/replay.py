"""The consistency controller's view rebuilt from a lineage's own events: the active workers, those that sent
their final pull, and each worker's clock, as psrv/server/consistency/base.py keeps them."""
from __future__ import annotations

from psrv.experiments.history.reading import Event

# drops the controller saw (its clock moved): "late" (a finished clock's), "nonfinite" (--nonfinite skip).
# "invalid" (--nonfinite reject) is refused before the controller: the worker's clock stays.
COUNTED_DROPS = ("late", "nonfinite")


class Membership:
    """Controller's active set, `finishing` and `clocks`, moved by `apply`, `drop` and `member` events."""

    def __init__(self, workers: int):
        self.active: set[int] = set(range(workers))  # every worker of the run is active from the start
        self.finishing: set[int] = set()
        self.clocks: dict[int, int] = {w: 0 for w in range(workers)}

    def see(self, e: Event) -> None:
        if e.ev == "member":
            w, what = e["w"], e["what"]
            if what == "join":
                self.active.add(w)
                self.finishing.discard(w)
                self.clocks.setdefault(w, 0)
            elif what in ("leave", "lost"):
                self.active.discard(w)
                self.finishing.discard(w)
            elif what == "finish" and w in self.active:
                self.finishing.add(w)
        elif e.ev == "apply" or (e.ev == "drop" and e["why"] in COUNTED_DROPS):
            # Controller.push: a worker's clock is the steps it pushed, max(old, clock + 1)
            self.clocks[e["w"]] = max(self.clocks.get(e["w"], 0), e["clock"] + 1)

    def pushing(self) -> set[int]:
        """The workers a sync barrier waits for: active, final pull not yet sent."""
        return self.active - self.finishing

    def slowest(self) -> tuple[int, int | None]:
        """The lowest clock of an active worker and that worker (0 and None with none active, as pull_ready)."""
        return min(((self.clocks.get(w, 0), w) for w in self.active), default=(0, None))
