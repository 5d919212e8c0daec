"""The consistency controller's view rebuilt from a lineage's own events: the active workers, those that sent
their final pull, and each worker's clock, as psrv/server/consistency/base.py keeps them."""
from __future__ import annotations

from psrv.experiments.launcher.history.reading import Event

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
        self.joining: dict[int, int] = {}  # sync: a (re)joined worker -> the first clock its barrier counts it

    def see(self, e: Event) -> None:
        if e.ev == "member":
            w, what = e["w"], e["what"]
            if what == "join":
                self.active.add(w)
                self.finishing.discard(w)
                self.clocks.setdefault(w, 0)
                self.joining.pop(w, None)
                if e.fields.get("from_clock") is not None:
                    self.joining[w] = e["from_clock"]
            elif what == "expect":  # its first pull named a later clock (SyncController.expect)
                if w in self.joining:
                    self.joining[w] = max(self.joining[w], e["from_clock"])
            elif what == "finish":
                if w in self.active:
                    self.finishing.add(w)
            else:  # "leave", "lost" (silent), "misfit" (refused for its model): out of the active set
                self.active.discard(w)
                self.finishing.discard(w)
                self.joining.pop(w, None)
        elif e.ev == "apply" or (e.ev == "drop" and e["why"] != UNSEEN_DROP):
            # Controller.push: a worker's clock is the steps it pushed, max(old, clock + 1)
            self.clocks[e["w"]] = max(self.clocks.get(e["w"], 0), e["clock"] + 1)

    def pushing(self) -> set[int]:
        """The workers a sync barrier waits for: active, final pull not yet sent, not joining a later clock."""
        return self.active - self.finishing - self.joining.keys()

    def committed(self, clock: int) -> None:
        """Sync's clock `clock` committed: a joiner counted from the next one counts from now on."""
        self.joining = {w: c for w, c in self.joining.items() if c > clock + 1}

    def slowest(self) -> tuple[int, int | None]:
        """The lowest clock of an active worker and that worker (0 and None with none active, as pull_ready)."""
        return min(((self.clocks.get(w, 0), w) for w in self.active), default=(0, None))
