"""int8: each chunk of CHUNK elements (psrv/codecs/scale_blocks.py) as int8 q = round(x / s) clamped to
+-127, decoded as q * s: symmetric linear quantisation with round-to-nearest, the absmax scheme of
Dettmers et al. 2022 (LLM.int8) applied per chunk. The scale s is max|x_i| / 127 over the chunk's
elements the codec covers (`among`; the others travel dense and get q = 0, written over by the
shard), and 1 where that max is 0. A NaN or Inf among the covered elements makes its chunk's s NaN or
Inf, never a finite number, so the shard refuses the push as non-finite (its --nonfinite policy)."""
from __future__ import annotations

import torch

from psrv.codecs.base import part
from psrv.codecs.scale_blocks import (ChunkedCodec, DenseDecoded, chunk_param, chunks, covered, divide_chunks, per_chunk,
                                      scale_chunks_)


class Int8(ChunkedCodec):
    name = "int8"

    def encode(self, x: torch.Tensor, among: torch.Tensor | None) -> dict[str, torch.Tensor]:
        x, _ = covered(x, among, self.chunk)
        scales = per_chunk(x.abs(), self.chunk, lambda rows: rows.amax(dim=1)) / 127  # amax keeps a NaN
        scales = torch.where(scales == 0, 1.0, scales)  # an all-zero chunk; NaN and Inf stay as they are
        q = torch.round(divide_chunks(x, scales, self.chunk)).clamp_(-127, 127).to(torch.int8)
        return {"q": q, "scales": scales}

    @staticmethod
    def decode(parts: dict[str, torch.Tensor], params: dict, n: int) -> DenseDecoded:
        chunk = chunk_param(params)
        q = part(parts, "q", torch.int8, n)
        scales = part(parts, "scales", torch.float32, chunks(n, chunk))

        def fill(out: torch.Tensor) -> None:
            scale_chunks_(out.copy_(q.to(out.device)), scales.to(out.device), chunk)
        return DenseDecoded(fill, [scales])
