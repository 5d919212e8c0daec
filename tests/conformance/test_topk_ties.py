"""Top-k's tie rule (psrv/codecs/sparse.py `largest`): among elements tied at the k-th magnitude the lowest
positions are sent, whatever torch.topk would pick, so that a reference written elsewhere (or another
implementation) chooses the same set. Checked against Python's stable sort, on tensors built to tie."""
from __future__ import annotations

import math

import torch

from psrv.codecs import make
from psrv.codecs.sparse import largest
from psrv.codecs.sparseloco import CHUNK, chosen_in_pool


def by_sort(x: list[float], k: int) -> list[int]:
    """The k largest |x| by a stable sort: equal magnitudes keep their order, so the lowest position wins."""
    return sorted(sorted(range(len(x)), key=lambda i: -abs(x[i]) if not math.isnan(x[i]) else -math.inf)[:k])


def tied(n: int, seed: int) -> torch.Tensor:
    """n values drawn from five magnitudes and both signs: every k-th value ties with many others."""
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([0.25, 0.5, 1.0, 2.0, 3.0])[torch.randint(0, 5, (n,), generator=g)] * \
        (torch.randint(0, 2, (n,), generator=g) * 2 - 1)


def test_ties_go_to_the_lowest_positions():
    for seed in range(20):
        x = tied(997, seed)
        for k in (1, 7, 100, 500, 996, 997):
            assert largest(x.abs(), k).tolist() == by_sort(x.tolist(), k), (seed, k)


def test_a_permuted_layout_chooses_the_same_set():
    """The same values reached through a strided view: the choice depends on values and positions only."""
    x = tied(4000, 3)
    strided = torch.stack([x, torch.zeros_like(x)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    assert torch.equal(largest(strided.abs(), 333), largest(x.abs(), 333))


def test_nan_ranks_first():
    x = tied(50, 1)
    x[[7, 30]] = math.nan
    x[12] = math.inf
    got = largest(x.abs(), 2).tolist()
    assert got == [7, 12], got  # NaN ranks with +inf: the first two of the three, by position


def test_each_row_of_a_matrix_is_its_own():
    x = tied(5 * 64, 4).view(5, 64)
    got = largest(x.abs(), 9)
    assert got.shape == (5, 9)
    for r in range(5):
        assert got[r].tolist() == by_sort(x[r].tolist(), 9), r


def test_topk_codec_sends_the_tie_rules_set():
    x = tied(3000, 5)
    parts = make("topk:0.1").encode(x, None)
    assert parts["indices"].tolist() == by_sort(x.tolist(), 300)


def test_sparseloco_chunks_send_the_tie_rules_set():
    x = tied(2 * CHUNK + 100, 6)
    k = 41
    local, at = chosen_in_pool(x, k)
    want = []
    for start in range(0, x.numel(), CHUNK):
        piece = x[start:start + CHUNK].tolist()
        want += [start + i for i in by_sort(piece, min(k, len(piece)))]
    assert at.tolist() == want


def test_nothing_to_choose_from():
    assert largest(torch.zeros(0), 0).tolist() == []
    assert largest(torch.zeros(3, 0), 0).shape == (3, 0)
    assert make("topk:0.1").encode(torch.zeros(0), None)["indices"].numel() == 0


def test_on_another_device_the_positions_stay_there():
    """The meta device stands in for a GPU: the positions are made where the magnitudes are, in their shape."""
    for shape, k in (((50,), 5), ((3, 50), 5), ((50,), 0), ((3, 50), 0)):
        got = largest(torch.empty(shape, device="meta"), k)
        assert got.device.type == "meta" and got.shape == shape[:-1] + (k,), (shape, k, got)
