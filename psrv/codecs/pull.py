"""A compressed pull, both ends (`--compress-pull CODEC`): a shard sends a worker the compressed change
of its weights since that worker's own copy, and both ends update the copy with the same function
(`PullDelta.apply_to`), so the shard's mirror of the worker's copy and the copy itself stay equal bit
for bit.

With error feedback (the default) the shard keeps, per worker, a mirror x of the copy it holds and sends
C(w - x): what an earlier pull left out (the residual w - x) rides along with the new change, as in
DoubleSqueeze (Tang et al. 2019) and DORE (Liu et al. 2020). The residual is x - w itself, so the worker's
view drifts from the shard's weights by exactly it, no more. A sparse codec (top-k, random-k) then sends
the weights at the positions it chose, not their change, and the elements of small tensors (under
compress_min_numel) travel as the weights themselves: those positions of the copy become the shard's
exactly, and top-k at ratio 1 is a dense pull, bit for bit. Without error feedback the shard keeps the
weights it last sent from, b, sends C(w - b) and sets b = w: what the codec leaves out is lost, and the
view drifts by the sum of those losses until a dense resynchronisation.

The codecs are the push's (their names: psrv/codec_names.py), the casts float16/bfloat16 sending the change
cast to that dtype. Header, in the reply's field `pull_codec`: the push's codec
fields (`name`, its parameters, `n`, `dense` ranges) and `ef`, whether positions are sent as weights."""
from __future__ import annotations

import torch

from psrv.codec_names import parse
from psrv.codecs import LOSSY, make
from psrv.codecs.base import Codec, Decoded, bad, part
from psrv.codecs.push import checked_ranges
from psrv.codecs.scale_blocks import DenseDecoded
from psrv.codecs.sparse import SparseDecoded
from psrv.protocol import ErrorCode, ProtocolError

CAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class Cast(Codec):
    """float16 / bfloat16: the change, cast (2 bytes an element)."""

    def __init__(self, name: str):
        self.name, self.dtype = name, CAST_DTYPES[name]

    def encode(self, x: torch.Tensor, among: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return {"values": x.to(self.dtype)}

    @staticmethod
    def decode(parts: dict[str, torch.Tensor], params: dict, n: int) -> Decoded:
        values = part(parts, "values", CAST_DTYPES[params["name"]], n)
        return DenseDecoded(lambda out: out.copy_(values), [values])


def make_pull_codec(spec: str, *, seed: int, sign_scale: str) -> Codec:
    """The codec a --compress-pull value names (ValueError for another): the push's lossy codecs, or a cast."""
    name, _ = parse(spec)
    return Cast(name) if name in CAST_DTYPES else make(spec, seed=seed, sign_scale=sign_scale)


class PullDelta:
    """A received pull's change, checked: `apply_to(x)` brings the copy x of the shard's range up to date."""

    def __init__(self, inner: Decoded, ef: bool, ranges: list[list[int]], values: torch.Tensor | None):
        self.inner, self.ef, self.ranges, self.values = inner, ef, ranges, values

    def apply_to(self, x: torch.Tensor) -> None:
        """x += the change; under error feedback a sparse codec's positions and the dense ranges are set to
        the weights sent there. The same float operations on the shard's mirror and the worker's copy."""
        if isinstance(self.inner, SparseDecoded):
            index, values = self.inner.indices.to(x.device, torch.int64), self.inner.values.to(x.device)
            if self.ef:
                x.index_copy_(0, index, values)
            else:
                x.index_add_(0, index, values)
        else:
            change = self.inner.densify(torch.empty_like(x))
            for a, b in self.ranges:  # sign and int8 cover them too: the dense part says what goes there
                change[a:b] = 0.0
            x.add_(change)
        at = 0
        for a, b in self.ranges:
            values = self.values[at:at + b - a].to(x.device)
            x[a:b].copy_(values) if self.ef else x[a:b].add_(values)
            at += b - a


def encode_pull(codec: Codec, ref: torch.Tensor, weights: torch.Tensor, *, ef: bool,
                dense: list[list[int]], among: torch.Tensor | None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the `pull_codec` header, the parts) of the change from `ref` (the mirror of the worker's copy, or
    the weights last sent) to `weights`; `dense`: ranges sent exactly, `among`: the positions the codec covers."""
    change = weights - ref
    fields = {"name": codec.name, **codec.params(), "n": weights.numel(), "ef": ef}
    parts = codec.encode(change, among)
    if ef and "indices" in parts:  # the weights at the chosen positions, not their change: exact there
        parts["values"] = weights[parts["indices"].to(weights.device, torch.int64)]
    if dense:
        fields["dense"] = dense
        parts["dense"] = torch.cat([(weights if ef else change)[a:b] for a, b in dense])
    return fields, {k: v.detach().cpu().contiguous() for k, v in parts.items()}


def decode_pull(fields: dict, parts: dict[str, torch.Tensor], size: int) -> PullDelta:
    """The checked change of a range of `size` elements; MALFORMED for an unknown codec, BAD_TENSOR for
    parts that disagree with the header."""
    if not isinstance(fields, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "pull_codec must be a map")
    name = fields.get("name")
    decoder = (Cast if name in CAST_DTYPES else LOSSY.get(name)) if isinstance(name, str) else None  # a list: no crash
    if decoder is None:
        raise ProtocolError(ErrorCode.MALFORMED, f"unknown pull codec {name!r}")
    if fields.get("n") != size:
        raise bad(f"compressed pull for {fields.get('n')!r} elements; this range has {size}")
    inner = decoder.decode(parts, fields, size)
    ranges = fields.get("dense", [])
    values = parts.get("dense")
    if ranges and (values is None or values.dtype != torch.float32):
        raise bad("dense ranges need a float32 part 'dense'")
    if ranges:
        checked_ranges(ranges, size, values.numel())
    return PullDelta(inner, bool(fields.get("ef")), ranges or [], values)
