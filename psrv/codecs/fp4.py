"""fp4: each chunk of CHUNK elements (psrv/codecs/scale_blocks.py) as a 4-bit signed integer q = round(x / s)
clamped to +-7, packed two to a byte, decoded as q * s: int8's absmax scheme (psrv/codecs/int8.py) at 4
bits. Not the e2m1 float: an integer grid with a per-chunk scale spends its 15 levels evenly, where a
pseudo-gradient's chunk has no outliers for e2m1's wider range to catch, and round-to-nearest on it
is one line. The scale s is max|x_i| / 7 over the chunk's covered elements (1 where that max is 0);
a NaN or Inf makes the chunk's s non-finite, so the shard refuses the push as non-finite.

Packing: element 2i in the low nibble of byte i, element 2i+1 in the high one, each as q + 8 (1..15;
8 is zero); an odd count leaves the last high nibble 0. Streaming DiLoCo's outer gradients travel so
(`--outer-dtype fp4`, docs/compression.md); 4.03 bits per element with the scales."""
from __future__ import annotations

import torch

from psrv.codecs.base import part
from psrv.codecs.scale_blocks import (ChunkedCodec, DenseDecoded, chunk_param, chunks, covered, divide_chunks, per_chunk,
                                      scale_chunks_)

LEVELS = 7  # q in [-7, 7]


def pack(q: torch.Tensor) -> torch.Tensor:
    """int values in [-7, 7] -> uint8 bytes, two per byte (low nibble first)."""
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    if u.numel() % 2:
        u = torch.cat([u, torch.zeros(1, dtype=torch.uint8, device=u.device)])
    pairs = u.view(-1, 2)
    return pairs[:, 0] | (pairs[:, 1] << 4)


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """pack's inverse: n float32 values in [-7, 7]."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=1).view(-1)[:n].to(torch.float32).sub_(8)


class Fp4(ChunkedCodec):
    name = "fp4"

    def encode(self, x: torch.Tensor, among: torch.Tensor | None) -> dict[str, torch.Tensor]:
        x, _ = covered(x, among, self.chunk)
        scales = per_chunk(x.abs(), self.chunk, lambda rows: rows.amax(dim=1)) / LEVELS  # amax keeps a NaN
        scales = torch.where(scales == 0, 1.0, scales)
        q = torch.round(divide_chunks(x, scales, self.chunk)).clamp_(-LEVELS, LEVELS)
        q = torch.nan_to_num(q, nan=0.0)  # the non-finite scale already marks the push
        return {"q": pack(q), "scales": scales}

    @staticmethod
    def decode(parts: dict[str, torch.Tensor], params: dict, n: int) -> DenseDecoded:
        chunk = chunk_param(params)
        q = part(parts, "q", torch.uint8, (n + 1) // 2)
        scales = part(parts, "scales", torch.float32, chunks(n, chunk))

        def fill(out: torch.Tensor) -> None:
            scale_chunks_(out.copy_(unpack(q, n).to(out.device)), scales.to(out.device), chunk)
        return DenseDecoded(fill, [scales])
