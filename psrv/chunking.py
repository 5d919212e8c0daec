"""How a push is cut into chunks, the same on both sides (a chunk's header says only [i, n]).

The worker's client cuts a dense push over its size limit (psrv/client/psclient.py); the shard applies the
chunks as they arrive (psrv/server/pushes/chunked.py). Chunks start at multiples of ALIGN elements: torch's
vectorised kernels then treat every element as they would in the whole tensor (an unaligned cut
moves elements between the vector loop and its scalar tail, whose rounding differs in the last bit).
"""
from __future__ import annotations

ALIGN = 64  # elements


def chunk_range(size: int, n: int, i: int) -> tuple[int, int]:
    """Elements [lo, hi) of chunk i of n over `size`: chunks of ceil(size / n) rounded up to ALIGN, the
    last one shorter (possibly empty, which a shard refuses: chunk_count never makes one)."""
    step = -(-(-(-size // n)) // ALIGN) * ALIGN
    return min(size, i * step), min(size, (i + 1) * step)


def chunk_count(size: int, max_elements: int) -> int:
    """How many chunks a push of `size` elements takes with about `max_elements` each (at most that
    rounded up to ALIGN); 1: it goes whole."""
    if max_elements <= 0 or size <= max_elements:
        return 1
    n = -(-size // max_elements)
    while n > 1 and chunk_range(size, n, n - 1)[0] >= size:
        n -= 1
    return n
