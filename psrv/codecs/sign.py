"""sign: scaled sign, 1 bit per element. Each chunk of CHUNK elements (psrv/codecs/chunked.py) is
sent as its signs, packed 8 to a byte (numpy.packbits, little bit order; a set bit is x >= 0), and
one scale s, so the chunk decodes to s * sign(x). This is the scaled sign C(x) = (||x||_1 / d) sign(x)
of EF-SignSGD (Karimireddy et al. 2019, "Error Feedback Fixes SignSGD and other Gradient Compression
Schemes", Algorithm 1), taken per chunk rather than per tensor: s = sum|x_i| / d over the d elements
of the chunk that the codec covers (`among`; the others travel dense, are sent as +s and written over
by the shard), s = 0 for a chunk it does not cover at all. A NaN or Inf among them makes s NaN or Inf."""
from __future__ import annotations

import numpy as np
import torch

from psrv.codecs.base import part
from psrv.codecs.chunked import ChunkedCodec, DenseDecoded, chunk_param, chunks, covered, expand, per_chunk


class Sign(ChunkedCodec):
    name = "sign"

    def encode(self, x: torch.Tensor, among: torch.Tensor | None) -> dict[str, torch.Tensor]:
        x, counts = covered(x, among, self.chunk)
        sums = per_chunk(x.abs(), self.chunk, lambda rows: rows.sum(dim=1))
        bits = np.packbits((x >= 0).cpu().numpy(), bitorder="little")
        return {"bits": torch.from_numpy(bits), "scales": sums / counts.clamp(min=1)}

    @staticmethod
    def decode(parts: dict[str, torch.Tensor], params: dict, n: int) -> DenseDecoded:
        chunk = chunk_param(params)
        bits = part(parts, "bits", torch.uint8, (n + 7) // 8)
        scales = part(parts, "scales", torch.float32, chunks(n, chunk))

        def fill(out: torch.Tensor) -> None:
            signs = torch.from_numpy(np.unpackbits(bits.numpy(), count=n, bitorder="little"))
            out.copy_(signs.to(out.device, torch.float32).mul_(2).sub_(1))  # 1 -> +1, 0 -> -1
            out.mul_(expand(scales.to(out.device), chunk, n))
        return DenseDecoded(fill, [scales])
