"""A compressed push, both ends. The worker (`PushEncoder`) runs the codec per shard range: it adds
its error-feedback residual to the shard's slice of the gradient, encodes it, decodes its own
message exactly as the server will, and keeps the difference as the next residual (Karimireddy et al.
2019, EF-SGD: e <- g + e - C(g + e)) once the shard has applied the push (`settle`): a push the shard
dropped (late, non-finite) leaves the residual as it was. Tensors under `min_numel` elements (biases, norms) travel
dense beside the codec's parts. The server (`decode_push`) checks the header and the parts against
its shard size and returns a Decoded it adds straight into its accumulator.

Header, in the push's fields: `codec` = {`name`, its parameters (`ratio`, `chunk`), `n`: the shard's
element count, `dense`: [[start, stop], ...] shard-relative ranges sent exactly in part `dense`}."""
from __future__ import annotations

import math

import torch

from psrv.codecs import LOSSY
from psrv.codecs.base import Codec, Decoded, bad, complement
from psrv.codecs.sparse import SparseDecoded, warmup_ratio
from psrv.partition import PartitionPlan
from psrv.protocol import ErrorCode, ProtocolError

MAX_DENSE_RANGES = 2048  # keeps the header far under its 64 KiB
WARMED = ("topk", "randomk")  # the codecs DGC's warm-up raises the ratio of


def dense_ranges(plan: PartitionPlan, shard: int, min_numel: int) -> list[list[int]]:
    """Shard-relative [start, stop) of the pieces of tensors smaller than `min_numel` elements."""
    lo, _ = plan.ranges[shard]
    numel = {p.name: p.numel for p in plan.params}
    out, starts = [], _starts(plan)
    for name, a, b in plan.pieces(shard):
        if numel[name] < min_numel:
            start = starts[name] + a - lo
            if out and out[-1][1] == start:  # adjacent small tensors: one range
                out[-1][1] = start + b - a
            else:
                out.append([start, start + b - a])
    return out


def _starts(plan: PartitionPlan) -> dict[str, int]:
    starts, offset = {}, 0
    for p in plan.params:
        starts[p.name] = offset
        offset += p.numel
    return starts


class SettledOnAnswer:
    """A worker-side state over the flat gradient (error feedback's residual, momentum correction's velocity)
    whose update for a shard waits for that shard's answer: a push writes the shard's range of `_next` and
    marks the shard pending; `settle` makes it the state where the push was applied and keeps the old one
    where it was dropped, and `forget` gives it up where no answer will come. Subclasses set `ranges`,
    `_next` and `_pending`, and name their state in `_held` (None: nothing held)."""

    ranges: list[tuple[int, int]]
    _next: torch.Tensor | None
    _pending: set[int]

    def _held(self) -> torch.Tensor | None:
        raise NotImplementedError

    def forget(self, shard: int | None = None) -> None:
        """No answer will settle shard's pending state (all shards' with None): a push that went raw, or a
        push round that ended in an error."""
        if shard is None:
            self._pending.clear()
        else:
            self._pending.discard(shard)

    def settle(self, shard: int, *, applied: bool) -> bool:
        """Shard answered its last push: applied, its pending state becomes the state; dropped, the state
        stays. False when shard had no push pending (a raw one, or already settled)."""
        if shard not in self._pending:
            return False
        self._pending.discard(shard)
        held = self._held()
        if applied and held is not None:
            lo, hi = self.ranges[shard]
            held[lo:hi].copy_(self._next[lo:hi])
        return True


class PushEncoder(SettledOnAnswer):
    """Encodes each shard's slice of a flat gradient with `codec`; `error` (None without error
    feedback) is the flat residual kept between pushes (state_dict / load_state_dict save it).

    The residual a push leaves is pending until its shard answers: `settle(shard, applied=True)`
    makes it the residual, `applied=False` (dropped late, or non-finite) keeps the one before, so
    the residual owed from earlier pushes is never lost with a dropped one. `chosen[shard]`: the
    shard-relative indices a sparse codec sent in the last push (None for sign and int8). `warmup`: the
    pushes of DGC's warm-up training, over which top-k's or random-k's ratio rises to its own (`warmup_ratio`).
    `decay`: the residual's factor before it joins a push (--error-feedback-decay; 1: plain EF-SGD)."""

    def __init__(self, codec: Codec, plan: PartitionPlan, *, error_feedback: bool = True, min_numel: int = 0,
                 warmup: int = 0, decay: float = 1.0, device: torch.device | str = "cpu"):
        self.codec, self.ranges, self.decay = codec, plan.ranges, decay
        self.warmup = warmup if codec.name in WARMED else 0
        self.codecs = [codec.for_shard(s) for s in range(plan.num_shards)]
        self.error = torch.zeros(plan.total, dtype=torch.float32, device=device) if error_feedback else None
        self._next = torch.zeros_like(self.error) if error_feedback else None  # each shard's pending residual
        self._pending: set[int] = set()  # shards whose last encoded push is not settled yet
        self.chosen: list[torch.Tensor | None] = [None] * plan.num_shards
        self.dense = [dense_ranges(plan, s, min_numel) for s in range(plan.num_shards)]
        self.among = [complement(r, hi - lo, device) for r, (lo, hi) in zip(self.dense, self.ranges)]

    def encode(self, grad: torch.Tensor, shard: int, clock: int = 0) -> tuple[dict, dict[str, torch.Tensor]]:
        """(fields, parts) of shard's push of the flat `grad` at `clock` (the warm-up's); the residual it
        leaves waits for `settle`."""
        lo, hi = self.ranges[shard]
        if self.error is not None and self.error.device != grad.device:  # the model's device (a GPU)
            self.error, self._next = self.error.to(grad.device), self._next.to(grad.device)
        if self.among[shard] is not None and self.among[shard].device != grad.device:
            self.among[shard] = self.among[shard].to(grad.device)
        if self.error is None:
            x = grad[lo:hi].float()
        elif self.decay != 1.0:  # e <- decay e + g
            x = torch.add(grad[lo:hi], self.error[lo:hi], alpha=self.decay)
        else:
            x = grad[lo:hi] + self.error[lo:hi]
        fields = {"name": self.codec.name, **self.codec.params(), "n": hi - lo}
        if "ratio" in fields and self.warmup:  # top-k, random-k: the header says the ratio this push sent
            fields["ratio"] = warmup_ratio(fields["ratio"], clock, self.warmup)
            parts = self.codecs[shard].encode(x, self.among[shard], ratio=fields["ratio"])
        else:
            parts = self.codecs[shard].encode(x, self.among[shard])
        if self.dense[shard]:
            fields["dense"] = self.dense[shard]
            parts["dense"] = torch.cat([x[a:b] for a, b in self.dense[shard]])
        parts = {k: v.detach().cpu().contiguous() for k, v in parts.items()}
        self.chosen[shard] = parts.get("indices")
        if self.error is not None:
            sent = decode_push(fields, parts, hi - lo).densify(torch.empty(hi - lo, device="cpu"))
            torch.sub(x, sent.to(x.device), out=self._next[lo:hi])
        self._pending.add(shard)
        return {"codec": fields}, parts

    def _held(self) -> torch.Tensor | None:
        return self.error  # the residual; None without error feedback

    def state_dict(self) -> dict:
        return {"error": None if self.error is None else self.error.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        error = state.get("error")
        if (error is None) != (self.error is None):
            raise ValueError("error-feedback state saved with error feedback "
                             f"{'off' if error is None else 'on'}, this worker has it the other way")
        if error is not None:
            if tuple(error.shape) != tuple(self.error.shape):
                raise ValueError(f"error buffer of shape {tuple(error.shape)}, this model's is {tuple(self.error.shape)}")
            self.error.copy_(error.to(self.error.device))
        self._pending.clear()  # a push encoded before the load leaves nothing


def finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in `t`: one sum (NaN or Inf anywhere makes it non-finite), and the element-wise
    check only where the sum is not finite (finite values may sum past float32's range)."""
    if math.isfinite(t.sum(dtype=torch.float32).item()):
        return True
    return bool(torch.isfinite(t).all())


class WithDense(Decoded):
    """A codec's Decoded with the dense ranges added beside it (sparse: its indices avoid them) or
    written over it (sign, int8 cover the whole range)."""

    def __init__(self, inner: Decoded, ranges: list[list[int]], values: torch.Tensor):
        self.inner, self.ranges, self.values = inner, ranges, values

    def add_into(self, accum: torch.Tensor, scratch: torch.Tensor) -> None:
        if not isinstance(self.inner, SparseDecoded):
            accum.add_(self.densify(scratch))
            return
        self.inner.add_into(accum, scratch)
        at = 0
        for a, b in self.ranges:
            accum[a:b].add_(self.values[at:at + b - a].to(accum.device))
            at += b - a

    def densify(self, out: torch.Tensor) -> torch.Tensor:
        self.inner.densify(out)
        at = 0
        for a, b in self.ranges:
            out[a:b].copy_(self.values[at:at + b - a])  # a sparse codec left zeros there
            at += b - a
        return out

    def floats(self) -> list[torch.Tensor]:
        return [*self.inner.floats(), self.values]


def decode_push(fields: dict, parts: dict[str, torch.Tensor], size: int) -> Decoded:
    """The checked push of a shard of `size` elements: BAD_TENSOR for another size, parts that
    disagree with the header or indices out of range; UNKNOWN codec -> MALFORMED."""
    if not isinstance(fields, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "codec must be a map")
    codec = LOSSY.get(fields.get("name")) if isinstance(fields.get("name"), str) else None
    if codec is None:
        raise ProtocolError(ErrorCode.MALFORMED, f"unknown codec {fields.get('name')!r}; this server "
                            f"decodes {', '.join(sorted(LOSSY))}")
    if fields.get("n") != size:
        raise bad(f"compressed push for {fields.get('n')!r} elements; this shard has {size}")
    decoded = codec.decode(parts, fields, size)
    ranges = fields.get("dense", [])
    if not ranges:
        if "dense" in parts:
            raise bad("part 'dense' without dense ranges in the header")
        return decoded
    values = parts.get("dense")
    if values is None or values.dtype != torch.float32:
        raise bad("dense ranges need a float32 part 'dense'")
    return WithDense(decoded, checked_ranges(ranges, size, values.numel()), values)


def checked_ranges(ranges, size: int, count: int) -> list[list[int]]:
    """Sorted, disjoint [start, stop) within [0, size) covering `count` elements; BAD_TENSOR otherwise."""
    if not isinstance(ranges, list) or len(ranges) > MAX_DENSE_RANGES:
        raise bad(f"dense must be a list of at most {MAX_DENSE_RANGES} [start, stop] pairs")
    end, total = 0, 0
    for r in ranges:
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in r)
                and end <= r[0] < r[1] <= size):
            raise bad(f"dense range {r!r} is not a sorted, disjoint [start, stop) within [0, {size})")
        end, total = r[1], total + r[1] - r[0]
    if total != count:
        raise bad(f"dense ranges cover {total} elements; part 'dense' has {count}")
    return ranges
