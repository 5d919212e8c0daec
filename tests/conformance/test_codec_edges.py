"""What no case of the matrix can show about the sparse codecs, found by `make mutants`: a compressed pull with
exact (dense) ranges has its top-k or random-k choose among the other positions only (psrv/server/pulls.py
`among`), and the matrix's job has no such range. The reference: the k = ceil(ratio n) largest magnitudes
among those positions, picked here by sorting in Python."""
import math

import torch

from psrv.codecs import make
from psrv.codecs.randomk import RandomK
from psrv.codecs.topk import TopK

X = torch.randn(100, generator=torch.Generator().manual_seed(3))
AMONG = torch.arange(1, 100, 2)  # the odd positions: the even ones went exactly


def test_topk_among_positions_takes_the_largest_of_those_only():
    parts = TopK(0.1).encode(X, AMONG)
    k = math.ceil(0.1 * len(AMONG))
    want = sorted(sorted(AMONG.tolist(), key=lambda i: -abs(X[i].item()))[:k])
    assert parts["indices"].tolist() == want
    assert torch.equal(parts["values"], X[want])


def test_randomk_among_positions_draws_from_those_only():
    for seed in range(10):  # ten draws: one of 5 positions among 50 is all odd by chance one time in 40
        parts = RandomK(0.1, seed=seed).encode(X, AMONG)
        got = parts["indices"].tolist()
        assert len(got) == math.ceil(0.1 * len(AMONG)) == len(set(got)) and set(got) <= set(AMONG.tolist()), seed
        assert torch.equal(parts["values"], X[got])


def test_a_push_encoded_on_a_device_stays_there_and_decodes_into_the_shards_device():
    """A GPU worker's push is encoded where its gradient is, and a shard decodes CPU parts into its own device's
    buffer. The matrix runs on the CPU, where a `device=` left out changes nothing; the `meta` device stands in
    for the GPU here: a tensor made on the CPU by mistake meets a meta one and raises. Not sign: its scale reads
    a value (`.item()`), which a meta tensor has none of; top-k and random-k decode by checking their indices'
    values, so only their encoding is checked."""
    n = 2051  # two whole chunks of 1024 and one short, an odd count (fp4 pads its last byte)
    for spec in ("int8", "fp4", "topk:0.1", "randomk:0.1"):
        for among in (None, torch.arange(0, n, 3, device="meta")):
            codec = make(spec, seed=0)
            parts = codec.encode(torch.empty(n, device="meta"), among)
            assert {p.device.type for p in parts.values()} == {"meta"}, (spec, among is None)
            if spec in ("int8", "fp4"):
                cpu = type(codec).encode(codec, torch.randn(n), None)
                accum = torch.zeros(n, device="meta")
                type(codec).decode(cpu, codec.params(), n).add_into(accum, torch.empty(n, device="meta"))
                assert accum.device.type == "meta"
