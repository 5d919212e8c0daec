"""sparseloco:RATIO: SparseLoCo's codec (Sarfi, Thérien, Lidin, Belilovsky, "Communication Efficient LLM
Pre-training with SparseLoCo", arXiv 2508.15706): chunked top-k with 2-bit values.

- **Chunks:** the covered elements (`among`) in runs of CHUNK (4096, the paper's 64 x 64 chunk of a matrix), and
  in each the k = max(1, round(RATIO * CHUNK)) of largest magnitude (a last, shorter chunk: min(k, its length)).
  Each is sent as its int16 position within its chunk.
- **2-bit values:** the quantiser of the paper's reference code (tplr's TopKCompressor: 4 bins over a range of 6
  standard deviations). Over the push's K chosen values v:
  - shift = mean v, c = v - shift, σ = |c| / sqrt(K - 1) (0 for K = 1);
  - scale = 6σ / 4 (1 where that is 0 or not finite);
  - code = clamp(round(c / scale + 2), 0, 3), four to a byte;
  - the table of 4 float32 values the codes index holds shift plus the mean of the c that took each code (shift
    alone for a code none took).

A chosen value that is NaN or Inf makes the table NaN, so the shard refuses the push as non-finite. Bytes per
chosen element: 2.25, so RATIO 1/64 sends 0.88% of a dense float32 push. The error-feedback accumulator that
SparseLoCo puts in place of the outer momentum is the worker's, with `--error-feedback-decay`
(psrv/codecs/push.py); docs/compression.md has the whole recipe."""
from __future__ import annotations

import math

import torch

from psrv.codecs.base import Codec, Decoded, bad, complement, part
from psrv.codecs.sparse import largest

CHUNK = 4096
BINS, RANGE_SIGMAS = 4, 6.0


def per_chunk(ratio: float, chunk: int = CHUNK) -> int:
    """k, the elements a full chunk sends."""
    return max(1, min(chunk, round(ratio * chunk)))


def chunk_counts(pool: int, k: int, chunk: int = CHUNK) -> list[int]:
    """How many elements each chunk of a pool of `pool` elements sends."""
    full, rest = divmod(pool, chunk)
    return [k] * full + ([min(k, rest)] if rest else [])


def chosen_in_pool(pool: torch.Tensor, k: int, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions within each chunk, int64; positions within the pool) of each chunk's k of largest magnitude,
    chunk by chunk, ascending in each (ties: the lowest positions, psrv/codecs/sparse.py `largest`)."""
    full = pool.numel() // chunk
    local = []
    if full:
        local.append(largest(pool[:full * chunk].view(full, chunk).abs(), min(k, chunk)).reshape(-1))
    if pool.numel() > full * chunk:
        tail = pool[full * chunk:]
        local.append(largest(tail.abs(), min(k, tail.numel())))
    local = torch.cat(local) if local else torch.zeros(0, dtype=torch.int64, device=pool.device)
    return local, local + starts(pool.numel(), k, chunk).to(local.device)


def starts(pool: int, k: int, chunk: int = CHUNK) -> torch.Tensor:
    """Each chosen element's chunk start, chunk by chunk (int64)."""
    counts = torch.tensor(chunk_counts(pool, k, chunk), dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(counts.numel(), dtype=torch.int64) * chunk, counts)


def quantise(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, uint8 0..3; the table of BINS float32 values) of the chosen values v."""
    if not bool(torch.isfinite(v).all()):
        return torch.zeros(v.numel(), dtype=torch.uint8), torch.full((BINS,), math.nan)
    v = v.float().cpu()
    shift = v.mean() if v.numel() else torch.tensor(0.0)
    c = v - shift
    sigma = c.norm() / math.sqrt(v.numel() - 1) if v.numel() > 1 else torch.tensor(0.0)
    scale = float(RANGE_SIGMAS * sigma / BINS)
    if scale == 0.0 or not math.isfinite(scale):
        scale = 1.0
    codes = torch.round(c / scale + BINS // 2).clamp_(0, BINS - 1).to(torch.uint8)
    table = torch.full((BINS,), float(shift))
    for code in range(BINS):  # four means, each as torch's mean sums it: the reference's rounding to the bit
        took = codes == code
        if bool(took.any()):
            table[code] = shift + c[took].mean()
    return codes, table


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Four 2-bit codes to a byte, the first in the low bits."""
    padded = torch.zeros(-(-codes.numel() // 4) * 4, dtype=torch.uint8)
    padded[:codes.numel()] = codes
    q = padded.view(-1, 4)
    return q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)
    return ((packed.view(-1, 1) >> shifts) & 3).view(-1)[:n]


class SparseLoCo(Codec):
    name = "sparseloco"

    def __init__(self, ratio: float):
        self.ratio = ratio

    def params(self) -> dict:
        return {"ratio": self.ratio, "chunk": CHUNK}

    def encode(self, x: torch.Tensor, among: torch.Tensor | None) -> dict[str, torch.Tensor]:
        pool = x if among is None else x[among]
        local, at = chosen_in_pool(pool, per_chunk(self.ratio))
        codes, table = quantise(pool[at])
        return {"positions": local.to(torch.int16), "codes": pack(codes), "table": table}

    @staticmethod
    def decode(parts: dict[str, torch.Tensor], params: dict, n: int) -> Decoded:
        ratio, chunk = params.get("ratio"), params.get("chunk")
        if chunk != CHUNK or not isinstance(ratio, float) or not 0 < ratio <= 1:
            raise bad(f"sparseloco needs chunk {CHUNK} and a ratio in (0, 1]; got chunk {chunk!r}, ratio {ratio!r}")
        among = covered_positions(params.get("dense", []), n)
        pool = n if among is None else among.numel()
        k = per_chunk(ratio)
        count = sum(chunk_counts(pool, k))
        local = part(parts, "positions", torch.int16, count).long()
        codes = unpack(part(parts, "codes", torch.uint8, -(-count // 4)), count)
        table = part(parts, "table", torch.float32, BINS)
        lengths = torch.repeat_interleave(torch.tensor([min(chunk, pool - s) for s in range(0, pool, chunk)],
                                                       dtype=torch.int64),
                                          torch.tensor(chunk_counts(pool, k), dtype=torch.int64))
        if count and (int(local.min()) < 0 or bool((local >= lengths).any())):
            raise bad("sparseloco positions outside their chunk")
        at = local + starts(pool, k)
        return QuantisedSparse(at if among is None else among[at], codes, table)


def covered_positions(dense: list, n: int) -> torch.Tensor | None:
    """The positions of a shard's range that a codec covers: all (None) but the header's dense ranges (checked
    by decode_push before it adds them)."""
    if not dense:
        return None
    from psrv.codecs.push import checked_ranges  # push.py imports the codecs
    try:
        total = sum(b - a for a, b in dense)
    except (TypeError, ValueError):
        raise bad("dense must be a list of [start, stop] pairs") from None
    return complement(checked_ranges(dense, n, total), n)


class QuantisedSparse(Decoded):
    """The chosen positions (shard-relative, int64) and the table values their codes name."""

    def __init__(self, indices: torch.Tensor, codes: torch.Tensor, table: torch.Tensor):
        self.indices, self.codes, self.table = indices, codes, table

    def add_into(self, accum: torch.Tensor, scratch: torch.Tensor) -> None:
        accum.index_add_(0, self.indices.to(accum.device), self.table[self.codes.long()].to(accum.device))

    def densify(self, out: torch.Tensor) -> torch.Tensor:
        out.zero_()
        self.add_into(out, out)
        return out

    def floats(self) -> list[torch.Tensor]:
        return [self.table]
