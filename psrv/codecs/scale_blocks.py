"""Scale blocks, what sign and int8 share (not the chunks a push travels in, psrv/chunking.py): one float32
scale per block ("chunk") of CHUNK consecutive elements of the shard's
range (the last chunk may be shorter), computed over the chunk's elements the codec covers (`among`:
the elements of small tensors travel dense and are written over theirs), and a decoded push that is
a dense vector made once, in the shard's scratch."""
from __future__ import annotations

import math
from typing import Callable

import torch

from psrv.codecs.base import Codec, Decoded, int_param

CHUNK = 1024  # elements per scale: the scales add 4 bytes per 1024 elements (0.1% of float32)


def chunks(n: int, chunk: int) -> int:
    return math.ceil(n / chunk)


def per_chunk(x: torch.Tensor, chunk: int, reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """reduce(rows) over x cut into rows of `chunk` elements, the last padded with zeros: one value per chunk.
    Only a short last chunk is copied to pad it; the whole chunks are a view of x."""
    n = x.numel()
    whole = n // chunk * chunk
    rows = reduce(x[:whole].view(-1, chunk))
    if n == whole:
        return rows
    last = torch.nn.functional.pad(x[whole:], (0, chunk - (n - whole))).view(1, chunk)
    return torch.cat([rows, reduce(last)])


def scale_chunks_(out: torch.Tensor, scales: torch.Tensor, chunk: int) -> torch.Tensor:
    """out *= its chunk's scale, element by element, in place: what multiplying by each scale repeated over its
    chunk gives, without making that n-element expansion."""
    n = out.numel()
    whole = n // chunk * chunk
    out[:whole].view(-1, chunk).mul_(scales[: whole // chunk, None])
    if n > whole:
        out[whole:].mul_(scales[whole // chunk])
    return out


def divide_chunks(x: torch.Tensor, scales: torch.Tensor, chunk: int) -> torch.Tensor:
    """x / its chunk's scale, element by element (a new tensor): x divided by each scale repeated over
    its chunk, without making that expansion."""
    n = x.numel()
    whole = n // chunk * chunk
    out = torch.empty_like(x)
    torch.div(x[:whole].view(-1, chunk), scales[: whole // chunk, None], out=out[:whole].view(-1, chunk))
    if n > whole:
        torch.div(x[whole:], scales[whole // chunk], out=out[whole:])
    return out


def covered(x: torch.Tensor, among: torch.Tensor | None, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x with every element outside `among` set to 0, how many elements of each chunk `among` covers,
    as float32). among None: all of x, every chunk full but a shorter last one. A NaN or Inf outside
    `among` is dropped here: it travels in the dense part, which the shard checks as well."""
    n = x.numel()
    if among is None:
        counts = torch.full((chunks(n, chunk),), float(chunk), device=x.device)
        if n % chunk:
            counts[-1] = n % chunk
        return x, counts
    keep = torch.zeros(n, dtype=torch.bool, device=x.device)
    keep[among] = True
    return torch.where(keep, x, 0.0), per_chunk(keep.to(torch.float32), chunk, lambda rows: rows.sum(dim=1))


def chunk_param(params: dict) -> int:
    return int_param(params, "chunk", 1, 1 << 30)


class ChunkedCodec(Codec):
    """A codec with a float32 scale per `chunk` elements (sign, int8): the chunk is its one parameter."""

    def __init__(self, chunk: int = CHUNK):
        self.chunk = chunk

    def params(self) -> dict:
        return {"chunk": self.chunk}


class DenseDecoded(Decoded):
    """A push whose decoding is a dense vector: `fill(out)` writes it."""

    def __init__(self, fill: Callable[[torch.Tensor], None], floats: list[torch.Tensor]):
        self._fill, self._floats = fill, floats

    def add_into(self, accum: torch.Tensor, scratch: torch.Tensor) -> None:
        accum.add_(self.densify(scratch))

    def densify(self, out: torch.Tensor) -> torch.Tensor:
        self._fill(out)
        return out

    def floats(self) -> list[torch.Tensor]:
        return self._floats
