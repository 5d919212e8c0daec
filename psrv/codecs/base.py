"""What every push codec is: encode a float32 vector into named raw parts, and check and decode
received parts into a `Decoded` the shard adds to its accumulator (psrv/codecs/push.py wires them
to the worker's error feedback and to the server's validation)."""
from __future__ import annotations

import abc

import torch

from psrv.protocol import ErrorCode, ProtocolError


def bad(message: str) -> ProtocolError:
    """The error a malformed compressed push gets (BAD_TENSOR: the ERROR reply, nothing applied)."""
    return ProtocolError(ErrorCode.BAD_TENSOR, message)


class Decoded(abc.ABC):
    """A received push, checked: `add_into(accum)` adds it to a float32 vector of the shard's size,
    `densify(out)` writes it there (async and ssp apply one dense gradient)."""

    @abc.abstractmethod
    def add_into(self, accum: torch.Tensor, scratch: torch.Tensor) -> None:
        """accum += this push (`scratch`: a float32 vector of the same size this may overwrite)."""

    @abc.abstractmethod
    def densify(self, out: torch.Tensor) -> torch.Tensor:
        """This push as a dense float32 vector, written into `out` (returned)."""

    @abc.abstractmethod
    def floats(self) -> list[torch.Tensor]:
        """The float parts (values, scales): NaN or Inf in any of them is a non-finite push."""


class Codec(abc.ABC):
    """One lossy push codec. `params()` goes into the header beside `name`; `encode(x, among)` returns
    the named 1-D parts for the float32 vector x; a sparse codec selects only among `among` (int64
    positions; None: all, the others travel dense beside it); `decode(parts, params, n)` checks the parts
    against the header and the shard size n (ProtocolError BAD_TENSOR) and returns a Decoded."""

    name: str

    def params(self) -> dict:
        return {}

    def for_shard(self, shard: int) -> "Codec":
        """The codec for one shard's range: itself, or (a codec that draws at random) one with a stream of
        its own, so its draws do not depend on the order the shards are encoded in (overlap's order)."""
        return self

    @abc.abstractmethod
    def encode(self, x: torch.Tensor, among: torch.Tensor | None) -> dict[str, torch.Tensor]: ...

    @staticmethod
    @abc.abstractmethod
    def decode(parts: dict[str, torch.Tensor], params: dict, n: int) -> Decoded: ...


def complement(ranges: list[list[int]], n: int, device="cpu") -> torch.Tensor | None:
    """The positions of [0, n) outside `ranges` (a push's dense ranges: the ones a codec covers), int64; None where
    there are no ranges (all covered)."""
    if not ranges:
        return None
    keep = torch.ones(n, dtype=torch.bool)
    for a, b in ranges:
        keep[a:b] = False
    return keep.nonzero().view(-1).to(device)


def part(parts: dict[str, torch.Tensor], name: str, dtype: torch.dtype, numel: int | None = None) -> torch.Tensor:
    """Part `name`, of `dtype` and (when given) `numel` elements; BAD_TENSOR otherwise."""
    t = parts.get(name)
    if t is None:
        raise bad(f"compressed push lacks its {name!r} part")
    if t.dtype != dtype:
        raise bad(f"part {name!r} is {str(t.dtype).removeprefix('torch.')}, expected {str(dtype).removeprefix('torch.')}")
    if numel is not None and t.numel() != numel:
        raise bad(f"part {name!r} has {t.numel()} elements, expected {numel}")
    return t


def int_param(params: dict, name: str, lo: int, hi: int) -> int:
    value = params.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise bad(f"codec parameter {name!r} must be an integer in [{lo}, {hi}]; got {value!r}")
    return value
