"""The push codecs as their papers define them, written here from the definitions and never by calling
psrv's codec code: what a shard receives for a worker's slice x of the gradient, with the elements of
small tensors (under compress_min_numel) sent exactly beside the codec, and error feedback.

- top-k (Aji and Heafield 2017): the k = ceil(ratio n) largest |x_i| among the covered elements, exact.
- random-k (Stich et al. 2018): k covered elements drawn uniformly without replacement, exact.
- their warm-up (Lin et al. 2018, Deep Gradient Compression's warm-up training, as its code computes the
  warm-up epochs' ratios): over the first W pushes, the push of clock c sends ratio^((s+1)/5) in stage
  s = floor(4c/W) of four (reference.py gives `received` that ratio).
- scaled sign, per block of 1024 elements: sign(x_i) (+1 for x_i >= 0) times, over the block's covered
  elements, sqrt(mean x_i^2) (l2: 1-bit Adam's, Tang et al. 2021) or mean |x_i| (l1: EF-SignSGD's,
  Karimireddy et al. 2019).
- int8 (absmax, per block of 1024): s = max |x_i| over the block's covered elements / 127, q = round(x/s)
  clamped to [-127, 127], received as q s; an all-zero block has s = 1. fp4: the same with 7 for 127.
- SparseLoCo's (Sarfi et al. 2025, and the quantiser of its reference code, tplr's TopKCompressor with 4 bins
  over 6 sigma): the covered elements in chunks of 4096, in each the max(1, round(4096 ratio)) of largest |x_i|
  (a shorter last chunk: at most its length); over those K values v, shift = mean v, c = v - shift,
  sigma = |c| / sqrt(K - 1), step = 6 sigma / 4 (1 if 0 or not finite in float32), code = clamp(round(c / step + 2), 0, 3), and each is
  received as shift + the mean of the c that share its code.
- error feedback (EF-SGD, Karimireddy et al. 2019): x = g + e; send C(x); e <- x - C(x) once the push
  was applied (a dropped push leaves e as it was). With a decay beta (SparseLoCo's accumulator): x = g + beta e.
- momentum correction (Lin et al. 2018, Deep Gradient Compression, Algorithm 1 with momentum factor
  masking), where the servers run SGD with momentum m: u <- m u + (g + wd w); x = u (Nesterov: g + wd w
  + m u) + e; send C(x); with masking, zero u where a sparse codec sent; the servers step w <- w - lr C(x), no momentum
  of their own (reference.py does the worker's half, ref_optim.py the servers').
"""
from __future__ import annotations

import math

import torch

BLOCK = 1024
LEVELS = {"int8": 127, "fp4": 7}  # absmax quantisation's steps each side of zero
# tensors of fewer elements travel exact: --compress-min-numel's documented default (docs/compression.md; no paper
# fixes one), which job.py's biases are sized under; the reference's own, never read from psrv's config
MIN_NUMEL = 1024


def covered(slice_lo: int, slice_hi: int, sizes: list[int], min_numel: int) -> torch.Tensor:
    """Mask over [slice_lo, slice_hi) of the flat vector: True where the element's tensor has at least
    min_numel elements (the codec covers it), False where it travels exact."""
    mask = torch.ones(slice_hi - slice_lo, dtype=torch.bool)
    start = 0
    for n in sizes:
        a, b = max(start, slice_lo), min(start + n, slice_hi)
        if a < b and n < min_numel:
            mask[a - slice_lo:b - slice_lo] = False
        start += n
    return mask


def pulled(name: str, copy: torch.Tensor, w: torch.Tensor, ref: torch.Tensor, cover: torch.Tensor, *, ratio: float,
           ef: bool) -> torch.Tensor:
    """A worker's copy of a range after a compressed pull of `w`'s change from `ref`: copy + C(w - ref), but
    with error feedback the shard sends the weights themselves where they travel exactly (the elements a
    sparse codec chose, the tensors under compress_min_numel), so the copy equals w there to the bit."""
    sent, chosen = received(name, w - ref, cover, ratio=ratio, draw=None, sign_scale="l1")
    out = copy + sent
    if ef:
        exact = ~cover if chosen is None else (~cover).index_fill(0, chosen, True)
        out[exact] = w[exact]
    return out


def _largest(x: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k of largest magnitude, in ascending order; among equal magnitudes the earlier first,
    NaN above all (a stable descending sort, torch.sort's NaN order)."""
    order = torch.sort(x.abs(), descending=True, stable=True).indices[:k]
    return torch.sort(order).values


def _sparseloco(x: torch.Tensor, among: torch.Tensor, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    chunk = 4096
    k = max(1, min(chunk, round(ratio * chunk)))
    chosen = []
    for start in range(0, among.numel(), chunk):
        positions = among[start:start + chunk]
        chosen.append(positions[_largest(x[positions], min(k, positions.numel()))])
    chosen = torch.cat(chosen) if chosen else among[:0]
    v = x[chosen]
    c = v - v.mean()
    sigma = c.norm() / math.sqrt(v.numel() - 1) if v.numel() > 1 else torch.tensor(0.0)
    step = float(6.0 * sigma / 4)  # in float32, as the codec rounds it: a code at a boundary goes one way
    if step == 0.0 or not math.isfinite(step):
        step = 1.0
    codes = torch.round(c / step + 2).clamp(0, 3)
    out = x.clone()
    out[among] = 0.0
    for code in range(4):
        took = codes == code
        if took.any():
            out[chosen[took]] = v.mean() + c[took].mean()  # torch's mean: its sum's order is the codec's
    return out, chosen


def received(name: str, x: torch.Tensor, cover: torch.Tensor, *, ratio: float, draw: torch.Generator | None,
             sign_scale: str = "l1") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(what the shard decodes for the slice x (float32): the codec on the covered elements, x exactly on
    the others; the positions a sparse codec chose, None for a dense one)."""
    out = x.clone()
    among = cover.nonzero().view(-1)
    if name == "sparseloco":
        return _sparseloco(x, among, ratio)
    if name in ("topk", "randomk"):
        n = among.numel()
        k = min(n, max(1 if n else 0, math.ceil(ratio * n)))
        if name == "topk":
            chosen = among[_largest(x[among], k)]
        else:
            chosen = among[torch.randperm(n, generator=draw)[:k]]
        out[among] = 0.0
        out[chosen] = x[chosen]
        return out, chosen
    # the blocks as the rows of a matrix (the last one padded with uncovered zeros), each row's statistics over
    # its covered elements; a block with none is sent exact, as every uncovered element is
    rows = -(-x.numel() // BLOCK)
    pad = rows * BLOCK - x.numel()
    xb = torch.nn.functional.pad(x, (0, pad)).view(rows, BLOCK)
    cb = torch.nn.functional.pad(cover, (0, pad), value=False).view(rows, BLOCK)
    mags = torch.where(cb, xb.abs(), 0.0)
    count = cb.sum(1, keepdim=True).clamp(min=1)
    if name == "sign":
        scale = (mags.square().sum(1, keepdim=True) / count).sqrt() if sign_scale == "l2" else \
            mags.sum(1, keepdim=True) / count
        value = torch.where(xb >= 0, 1.0, -1.0) * scale
    elif name in LEVELS:
        top = LEVELS[name]
        s = mags.amax(1, keepdim=True) / top
        s = torch.where(s == 0, torch.ones_like(s), s)
        value = torch.round(xb / s).clamp(-top, top) * s
    else:
        raise ValueError(name)
    out = torch.where(cb, value, xb).view(-1)[:x.numel()]
    return out, None
