"""What top-k and random-k send: int32 indices into the shard's range and the float32 values there.
The server adds them into its accumulator with one scatter-add (index_add_). Their ratio over the first
pushes: `warmup_ratio` (DGC's warm-up training)."""
from __future__ import annotations

import math

import torch

from psrv.codecs.base import Decoded, bad, part


def count(ratio: float, n: int) -> int:
    """How many of n elements a RATIO keeps: ceil(ratio * n), at least 1 (of a non-empty vector)."""
    return min(n, max(1 if n else 0, math.ceil(ratio * n)))


def warmup_ratio(ratio: float, clock: int, pushes: int) -> float:
    """The ratio a sparse codec sends at push `clock` under Deep Gradient Compression's warm-up training
    (Lin et al. 2018): over the first `pushes` pushes four stages of pushes/4, stage s sending
    RATIO^((s+1)/5), as DGC's code takes its warm-up epochs' ratios (coefficient RATIO^(1/(W+1)), W = 4);
    for RATIO 0.001 that is the paper's 75%, 93.75%, 98.4%, 99.6% sparsity. RATIO itself from then on."""
    if clock >= pushes:
        return ratio
    return ratio ** ((4 * clock // pushes + 1) / 5)


def largest(mag: torch.Tensor, k: int) -> torch.Tensor:
    """Positions (int64, ascending) of the k largest of each row of `mag` (magnitudes, 1-D or 2-D; k at most
    a row's length), shaped (k,) or (rows, k). Where elements tie at the k-th magnitude, the lowest positions
    win: torch.topk's own choice among equal values changes with the input's layout, so a reference (or another
    implementation) could not reproduce it. NaN ranks with +inf, above every number."""
    if k == 0:
        return torch.zeros(mag.shape[:-1] + (0,), dtype=torch.int64, device=mag.device)
    rows, shape = mag.reshape(-1, mag.shape[-1]), mag.shape[:-1] + (k,)
    values, chosen = torch.topk(rows, k, sorted=False)  # along each row; in no order: sorted below
    if rows.is_meta:  # shapes only (a stand-in for another device in tests): no values, so nothing ties
        return torch.sort(chosen).values.view(shape)
    if bool(values.isnan().any()):
        rows = torch.nan_to_num(rows, nan=math.inf, posinf=math.inf)
        values, chosen = torch.topk(rows, k, sorted=False)
    kth = values.min(dim=1, keepdim=True).values
    # where no element outside torch.topk's choice ties the k-th, that choice is the only answer
    if not bool((rows == kth).scatter_(1, chosen, False).any()):
        return torch.sort(chosen).values.view(shape)
    need = (values == kth).sum(dim=1, keepdim=True)  # of the tied, as many as torch kept: the lowest positions
    tied = rows == kth
    keep = (rows > kth) | (tied & (tied.cumsum(dim=1) <= need))
    return keep.nonzero()[:, 1].view(shape)


def parts_of(x: torch.Tensor, chosen: torch.Tensor) -> dict[str, torch.Tensor]:
    """`chosen` ascending (a cache-friendly scatter on the server): `largest` gives them so, random-k sorts its draw."""
    return {"indices": chosen.to(torch.int32), "values": x[chosen]}


class SparseDecoded(Decoded):
    def __init__(self, indices: torch.Tensor, values: torch.Tensor):
        self.indices, self.values = indices, values

    def add_into(self, accum: torch.Tensor, scratch: torch.Tensor) -> None:
        accum.index_add_(0, self.indices.to(device=accum.device, dtype=torch.int64), self.values.to(accum.device))

    def densify(self, out: torch.Tensor) -> torch.Tensor:
        out.zero_()
        self.add_into(out, out)
        return out

    def floats(self) -> list[torch.Tensor]:
        return [self.values]


def decode_sparse(parts: dict[str, torch.Tensor], params: dict, n: int) -> SparseDecoded:
    """Indices (int32, each in [0, n)) and as many float32 values; BAD_TENSOR otherwise. Indices
    are not checked for repeats: a repeated index adds its values twice, as a scatter-add does."""
    indices = part(parts, "indices", torch.int32)
    values = part(parts, "values", torch.float32, indices.numel())
    if indices.numel() > n:
        raise bad(f"{indices.numel()} indices for a shard of {n} elements")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= n):
        raise bad(f"indices outside [0, {n}): {int(indices.min())}..{int(indices.max())}")
    return SparseDecoded(indices, values)
