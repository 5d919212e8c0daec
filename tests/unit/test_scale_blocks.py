"""Scale blocks without the n-element expansions (psrv/codecs/scale_blocks.py, sign's byte table): each gives
bit for bit what the plain formula gives, at every length a shard's range can have."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from psrv.codecs.int8 import Int8
from psrv.codecs.scale_blocks import divide_chunks, per_chunk, scale_chunks_
from psrv.codecs.sign import Sign, unpack_signs

CHUNK = 16
LENGTHS = (0, 1, 7, 8, 15, 16, 17, 64, 1000, 1003)


def _expanded(scales: torch.Tensor, n: int) -> torch.Tensor:
    return scales.repeat_interleave(CHUNK)[:n]


@pytest.mark.parametrize("n", LENGTHS)
def test_chunks_scale_and_divide_as_the_expansion_does(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x, scales = torch.randn(n, generator=g), torch.rand(-(-n // CHUNK), generator=g) + 0.1
    assert torch.equal(scale_chunks_(x.clone(), scales, CHUNK), x * _expanded(scales, n))
    assert torch.equal(divide_chunks(x, scales, CHUNK), x / _expanded(scales, n))
    padded = torch.nn.functional.pad(x, (0, len(scales) * CHUNK - n)).view(-1, CHUNK)
    for reduce in (lambda rows: rows.abs().sum(dim=1), lambda rows: rows.abs().amax(dim=1)):
        assert torch.equal(per_chunk(x, CHUNK, reduce), reduce(padded))


@pytest.mark.parametrize("n", LENGTHS)
def test_signs_unpack_as_numpy_unpacks_them(n: int) -> None:
    bits = np.random.default_rng(n).integers(0, 256, size=(n + 7) // 8, dtype=np.uint8)
    want = np.unpackbits(bits, count=n, bitorder="little").astype(np.float32) * 2 - 1
    got = unpack_signs(torch.from_numpy(bits), n, torch.full((n,), 7.0))
    assert torch.equal(got, torch.from_numpy(want))


@pytest.mark.parametrize("codec", [Sign(CHUNK), Sign(CHUNK, scale="l2"), Int8(CHUNK)], ids=["sign-l1", "sign-l2", "int8"])
@pytest.mark.parametrize("n", (1003, 1024))
def test_a_decoded_push_is_the_plain_formula_s(codec, n: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    parts = codec.encode(x, None)
    got = type(codec).decode(parts, codec.params(), n).densify(torch.full((n,), 7.0))
    scales = _expanded(parts["scales"], n)
    if isinstance(codec, Sign):
        signs = np.unpackbits(parts["bits"].numpy(), count=n, bitorder="little").astype(np.float32) * 2 - 1
        want = torch.from_numpy(signs) * scales
        assert torch.equal(torch.sign(got), torch.where(x >= 0, 1.0, -1.0))
    else:
        want = parts["q"].to(torch.float32) * scales
        assert torch.equal(parts["q"], torch.round(x / scales).clamp(-127, 127).to(torch.int8))
    assert torch.equal(got, want)
