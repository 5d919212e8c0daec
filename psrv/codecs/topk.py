"""topk:RATIO: the ceil(RATIO * n) elements of largest magnitude (Aji and Heafield 2017; with error
feedback, Stich et al. 2018 and Lin et al. 2018), sent as indices and values.
Among elements tied at the k-th magnitude, the lowest positions (psrv/codecs/sparse.py `largest`)."""
from __future__ import annotations

import torch

from psrv.codecs.base import Codec
from psrv.codecs.sparse import count, decode_sparse, largest, parts_of


class TopK(Codec):
    name = "topk"

    def __init__(self, ratio: float):
        self.ratio = ratio

    def params(self) -> dict:
        return {"ratio": self.ratio}

    def encode(self, x: torch.Tensor, among: torch.Tensor | None, ratio: float | None = None) -> dict[str, torch.Tensor]:
        """`ratio`: this push's, where it is not RATIO (the warm-up's)."""
        pool = x if among is None else x[among]
        k = count(self.ratio if ratio is None else ratio, pool.numel())
        chosen = largest(pool.abs(), k)
        return parts_of(x, chosen if among is None else among[chosen])

    decode = staticmethod(decode_sparse)
