"""What no case of the matrix can show about the sparse codecs, found by `make mutants`: a compressed pull with
exact (dense) ranges has its top-k or random-k choose among the other positions only (psrv/server/pulls.py
`among`), and the matrix's job has no such range. The reference: the k = ceil(ratio n) largest magnitudes
among those positions, picked here by sorting in Python."""
import math

import torch

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
