"""The consistency controller's view rebuilt from a lineage's own events: the active workers, those that sent
their final pull, and each worker's clock, as psrv/server/consistency/base.py keeps them."""
from __future__ import annotations

from psrv.experiments.history.reading import Event

# A drop the controller never saw: "invalid", a whole push refused as non-finite (--nonfinite reject) before it
# reached the controller, so its worker's clock stays. Every other drop ("late", "nonfinite" under --nonfinite
# skip, "partial": a chunked push given up) went through Controller.push, and its worker's clock moved.
UNSEEN_DROP = "invalid"
# pushes that reached a sync clock without a gradient: they fill no quorum, but their worker is done with it
VOID_DROPS = ("nonfinite", "partial")


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
            elif what == "finish":
                if w in self.active:
                    self.finishing.add(w)
            else:  # "leave", "lost" (silent), "misfit" (refused for its model): out of the active set
                self.active.discard(w)
                self.finishing.discard(w)
        elif e.ev == "apply" or (e.ev == "drop" and e["why"] != UNSEEN_DROP):
            # Controller.push: a worker's clock is the steps it pushed, max(old, clock + 1)
            self.clocks[e["w"]] = max(self.clocks.get(e["w"], 0), e["clock"] + 1)

    def pushing(self) -> set[int]:
        """The workers a sync barrier waits for: active, final pull not yet sent."""
        return self.active - self.finishing

    def slowest(self) -> tuple[int, int | None]:
        """The lowest clock of an active worker and that worker (0 and None with none active, as pull_ready)."""
        return min(((self.clocks.get(w, 0), w) for w in self.active), default=(0, None))
