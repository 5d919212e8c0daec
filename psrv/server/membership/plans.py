"""Whose partition plan a shard keeps, and which rank is refused when the workers' models differ.

Rank 0's model is the job's: it sends the initial weights. So rank 0's HELLO settles the shard's plan (or
a checkpoint's plan, when the shard resumed from one). A HELLO from another rank before rank 0's must be
answered too, and is welcomed on the plan it brings: its pulls wait for rank 0's INIT anyway. When rank 0
says HELLO, its plan is the shard's (a shard built on another rank's plan is built again, still empty),
and a rank that brought another plan is refused then, by its own rank, instead of rank 0 being refused
for coming second. Once settled, a HELLO with another plan is refused at once.

The refusal says what differs: the parameter count, and where the worker sent its parameters' names and
shapes (HELLO's `layout`, psrv/partition.py), the first parameter that differs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from psrv.protocol import ErrorCode, Message, ProtocolError

Layout = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Model:
    """What a HELLO says of its worker's model: the partition plan's hash, the number of parameters
    (None for a checkpoint's plan, which keeps its shard's size only), and each parameter's name and
    shape where the worker sent them."""

    hash: str
    total: int | None = None
    layout: Layout | None = None


def model_of(msg: Message) -> Model:
    """What a HELLO (already checked by validate.hello) says of its worker's model, for Plans:
    the plan's hash, the parameter count, and `layout` ([[name, [dims...]], ...]) where it was sent."""
    f = msg.fields
    layout = f.get("layout")
    if layout is None:
        return Model(f["plan_hash"], f["total"])
    if not (isinstance(layout, list) and all(
            isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], list)
            and all(type(d) is int and d >= 0 for d in e[1]) for e in layout)):
        raise ProtocolError(ErrorCode.MALFORMED, "HELLO's layout must be [[name, [dims...]], ...]")
    return Model(f["plan_hash"], f["total"], tuple((name, tuple(dims)) for name, dims in layout))


class Settled(NamedTuple):
    """What a HELLO changed: `build`, the shard must be built (again) for the plan's size; `expelled`,
    workers welcomed earlier on another plan than rank 0's, each with its refusal."""

    build: bool
    expelled: dict[int, ProtocolError]


@dataclass
class Plans:
    """The shard's plan (`current`), where it came from, and the workers welcomed before it was settled."""

    current: Model | None = None
    source: str = ""  # whose plan it is, for the refusal: "rank 0's", "rank 2's", "resumed from a checkpoint"
    settled: bool = False
    provisional: dict[int, Model] = field(default_factory=dict)  # welcomed before rank 0's HELLO: their models
    refused: dict[int, ProtocolError] = field(default_factory=dict)  # their requests' answer, until a HELLO fits

    @property
    def hash(self) -> str | None:
        return None if self.current is None else self.current.hash

    def resumed(self, plan_hash: str) -> None:
        """The shard resumed from a checkpoint: that plan is settled."""
        self.current, self.source, self.settled = Model(plan_hash), "resumed from a checkpoint", True
        self.provisional.clear()

    def hello(self, worker: int, model: Model, *, initialised: bool, heard: bool = False) -> Settled:
        """Take `worker`'s HELLO bringing `model`; ProtocolError PLAN_MISMATCH naming `worker` where its
        model differs from the settled plan, or from the one the shard's weights fit (`initialised`: an
        INIT came, which only tools send before rank 0's HELLO). A refused rank's other requests get the
        same refusal (`refused`) until a HELLO of its fits; unless the shard `heard` from that rank before,
        whose process (another one than the refused) goes on."""
        try:
            settled = self._hello(worker, model, initialised=initialised)
        except ProtocolError as refusal:
            if not heard:
                self.refused[worker] = refusal
            raise
        self.refused.pop(worker, None)
        self.refused.update(settled.expelled)
        return settled

    def _hello(self, worker: int, model: Model, *, initialised: bool) -> Settled:
        if self.current is None:
            self.current, self.source, self.settled = model, f"rank {worker}'s", worker == 0
            if worker != 0:
                self.provisional[worker] = model
            return Settled(build=True, expelled={})
        fits = model.hash == self.current.hash
        if not self.settled and worker == 0 and (fits or not initialised):
            self.current, self.source, self.settled = model, "rank 0's", True
            expelled = {w: self.refusal(w, m) for w, m in self.provisional.items() if m.hash != model.hash}
            self.provisional.clear()
            return Settled(build=not fits, expelled=expelled)
        if not self.settled and not initialised:  # rank 0 decides who differs: until then, its own plan
            self.provisional[worker] = model
            return Settled(build=False, expelled={})
        if not fits:
            raise self.refusal(worker, model)
        self.provisional.pop(worker, None)
        return Settled(build=False, expelled={})

    def refusal(self, worker: int, model: Model) -> ProtocolError:
        """PLAN_MISMATCH for `worker`, whose `model` differs from the shard's: what differs, and both hashes."""
        ours = self.current
        what = "; ".join(filter(None, (_count(model, ours), _first_difference(model.layout, ours.layout))))
        return ProtocolError(ErrorCode.PLAN_MISMATCH,
                             f"rank {worker}'s model differs from the one this shard serves ({self.source})"
                             f"{': ' + what if what else ''} (partition plan {model.hash}, this shard's "
                             f"{ours.hash}); every rank must build the same model")


def _count(theirs: Model, ours: Model) -> str:
    if ours.total is None or theirs.total == ours.total:
        return ""
    return f"{theirs.total:,} parameters against {ours.total:,}"


def _first_difference(theirs: Layout | None, ours: Layout | None) -> str:
    """The first parameter that differs, by name and shape ('' when either side sent no layout)."""
    if theirs is None or ours is None:
        return ""
    for i, (a, b) in enumerate(zip(theirs, ours)):
        if a != b:
            if a[0] == b[0]:
                return f"{a[0]!r} has shape {list(a[1])} against {list(b[1])}"
            return f"parameter {i} is {a[0]!r} {list(a[1])} against {b[0]!r} {list(b[1])}"
    if len(theirs) > len(ours):
        return f"{len(theirs)} parameter tensors against {len(ours)}: {theirs[len(ours)][0]!r} is extra"
    if len(theirs) < len(ours):
        return f"{len(theirs)} parameter tensors against {len(ours)}: {ours[len(theirs)][0]!r} is missing"
    return ""
