"""randomk:RATIO: ceil(RATIO * n) elements chosen uniformly without replacement, sent unscaled as
indices and values (Stich et al. 2018, "Sparsified SGD with memory": unbiased only with error
feedback). The choice comes from a generator seeded per worker and shard (seed * 1000003 + shard), so
a run repeats, whatever the order its shards' slices are encoded in."""
from __future__ import annotations

import torch

from psrv.codecs.base import Codec
from psrv.codecs.sparse import count, decode_sparse, parts_of


class RandomK(Codec):
    name = "randomk"

    def __init__(self, ratio: float, seed: int = 0):
        self.ratio, self.seed = ratio, seed
        self.generator = torch.Generator().manual_seed(seed)

    def for_shard(self, shard: int) -> "RandomK":
        return RandomK(self.ratio, seed=self.seed * 1_000_003 + shard)

    def params(self) -> dict:
        return {"ratio": self.ratio}

    def encode(self, x: torch.Tensor, among: torch.Tensor | None, ratio: float | None = None) -> dict[str, torch.Tensor]:
        """`ratio`: this push's, where it is not RATIO (the warm-up's)."""
        n = x.numel() if among is None else among.numel()
        k = count(self.ratio if ratio is None else ratio, n)
        chosen = torch.sort(torch.randperm(n, generator=self.generator)[:k]).values.to(x.device)  # ascending
        return parts_of(x, chosen if among is None else among[chosen])

    decode = staticmethod(decode_sparse)
