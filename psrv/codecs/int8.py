"""int8: each chunk of CHUNK elements (psrv/codecs/chunked.py) as int8 q = round(x / s), s = max|x| /
127 of the chunk (s = 1 for an all-zero chunk), decoded as q * s: symmetric linear quantisation with
round-to-nearest, the absmax scheme of Dettmers et al. 2022 (LLM.int8) applied per chunk."""
from __future__ import annotations

import torch

from psrv.codecs.base import part
from psrv.codecs.chunked import ChunkedCodec, DenseDecoded, chunk_param, chunks, expand, per_chunk


class Int8(ChunkedCodec):
    name = "int8"

    def encode(self, x: torch.Tensor, among: torch.Tensor | None) -> dict[str, torch.Tensor]:
        n = x.numel()
        scales = per_chunk(x.abs(), self.chunk, lambda rows: rows.amax(dim=1)) / 127
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))
        q = torch.round(x / expand(scales, self.chunk, n)).clamp_(-127, 127).to(torch.int8)
        return {"q": q, "scales": scales}

    @staticmethod
    def decode(parts: dict[str, torch.Tensor], params: dict, n: int) -> DenseDecoded:
        chunk = chunk_param(params)
        q = part(parts, "q", torch.int8, n)
        scales = part(parts, "scales", torch.float32, chunks(n, chunk))

        def fill(out: torch.Tensor) -> None:
            out.copy_(q.to(out.device)).mul_(expand(scales.to(out.device), chunk, n))
        return DenseDecoded(fill, [scales])
