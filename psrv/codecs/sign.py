"""sign: scaled sign, 1 bit per element. Each chunk of CHUNK elements (psrv/codecs/scale_blocks.py) is
sent as its signs, packed 8 to a byte (numpy.packbits, little bit order; a set bit is x >= 0), and
one scale s, so the chunk decodes to s * sign(x). The scale is taken over the d elements of the chunk
that the codec covers (`among`; the others travel dense, are sent as +s and written over by the
shard), s = 0 for a chunk it does not cover at all, by one of two rules (`scale`):

- "l1": s = sum|x_i| / d, the scaled sign C(x) = (||x||_1 / d) sign(x) of EF-SignSGD (Karimireddy et al.
  2019, "Error Feedback Fixes SignSGD and other Gradient Compression Schemes", Algorithm 1);
- "l2": s = sqrt(sum x_i^2 / d) = ||x||_2 / sqrt(d), 1-bit Adam's (Tang et al. 2021, as DeepSpeed's
  compressed_allreduce computes it). It is at least the l1 scale, by the most where a few elements
  dominate the chunk: those get more of their value through per push, so less of it waits in the
  error-feedback residual (docs/compression.md, "Momentum correction").

Taken per chunk rather than per tensor. A NaN or Inf among the covered elements makes s NaN or Inf.
The decoder needs neither rule: the scales travel."""
from __future__ import annotations

import numpy as np
import torch

from psrv.codecs.base import part
from psrv.codecs.scale_blocks import (CHUNK, ChunkedCodec, DenseDecoded, chunk_param, chunks, covered, per_chunk,
                                      scale_chunks_)


SCALES = ("l2", "l1")


class Sign(ChunkedCodec):
    name = "sign"

    def __init__(self, chunk: int = CHUNK, scale: str = "l1"):
        if scale not in SCALES:
            raise ValueError(f"sign's scale must be one of {', '.join(SCALES)}; got {scale!r}")
        super().__init__(chunk)
        self.scale = scale

    def encode(self, x: torch.Tensor, among: torch.Tensor | None) -> dict[str, torch.Tensor]:
        x, counts = covered(x, among, self.chunk)
        mags = x.abs() if self.scale == "l1" else x.square()
        means = per_chunk(mags, self.chunk, lambda rows: rows.sum(dim=1)) / counts.clamp(min=1)
        bits = np.packbits((x >= 0).cpu().numpy(), bitorder="little")
        return {"bits": torch.from_numpy(bits), "scales": means if self.scale == "l1" else means.sqrt()}

    @staticmethod
    def decode(parts: dict[str, torch.Tensor], params: dict, n: int) -> DenseDecoded:
        chunk = chunk_param(params)
        bits = part(parts, "bits", torch.uint8, (n + 7) // 8)
        scales = part(parts, "scales", torch.float32, chunks(n, chunk))

        def fill(out: torch.Tensor) -> None:
            if out.device.type == "cpu":
                unpack_signs(bits, n, out)
            else:
                out.copy_(unpack_signs(bits, n, torch.empty(n)))
            scale_chunks_(out, scales.to(out.device), chunk)
        return DenseDecoded(fill, [scales])


# byte b -> its 8 bits as +1.0 (set) or -1.0, least significant first (packbits' little bit order)
_SIGNS = torch.from_numpy(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1,
                                        bitorder="little").astype(np.float32) * 2 - 1)


def unpack_signs(bits: torch.Tensor, n: int, out: torch.Tensor) -> torch.Tensor:
    """The n signs packed in `bits`, +1.0 or -1.0, written into `out` (float32, CPU): each byte looks up its
    8 signs at once, one pass over out, not an unpacked byte per element first."""
    whole = n // 8
    torch.index_select(_SIGNS, 0, bits[:whole].long(), out=out[: whole * 8].view(whole, 8))
    if n > whole * 8:
        out[whole * 8:].copy_(_SIGNS[int(bits[whole])][: n - whole * 8])
    return out
