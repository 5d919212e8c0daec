"""--pull-extrapolate K over more rounds than the matrix's cases take (their 4 steps of H = 2 are two rounds, so
only the first extrapolation shows: the one from the initial weights): 4 rounds here, so each later round's start
(w + K (w - w'), w' the weights the previous pull brought) is checked against tests/conformance/reference.py, for
whole and fractional K, under async, a quorum and sync; and K = 0 is the plain run."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.conformance.axes import ATOL, DEFAULT, RTOL, run_config
from tests.conformance.cluster import one_thread, run  # noqa: F401 (one_thread: an autouse fixture)
from tests.conformance.reference import Reference

ROUNDS = 4


def config(k: float, **over):
    cfg = run_config({**DEFAULT, "local": 2, "extrapolate": k, **over})
    return dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, steps=2 * ROUNDS))



@pytest.mark.parametrize("over", [{"mode": "async"}, {"quorum": 2}, {}, {"mode": "ssp", "optimizer": "adam"}],
                         ids=["async", "quorum", "sync", "ssp-adam"])
@pytest.mark.parametrize("k", [1.0, 2.5])
def test_every_rounds_start_against_the_reference(over, k):
    cfg = config(k, **over)
    got, want = run(cfg, nan=False), Reference(cfg, nan=False).run()
    gap = (got.params - want.params).abs().max().item()
    assert torch.allclose(got.params, want.params, atol=ATOL, rtol=RTOL), f"{gap:.3g} from the reference"
    plain = Reference(config(0.0, **over), nan=False).run()
    assert not torch.allclose(want.params, plain.params, atol=ATOL, rtol=RTOL)  # the level is live: plain fails it


def test_k_zero_is_the_plain_run():
    cfg = config(0.0, mode="async")
    got, plain = run(cfg, nan=False), run(dataclasses.replace(cfg, worker=dataclasses.replace(
        cfg.worker, pull_extrapolate=0.0)), nan=False)
    assert torch.equal(got.params, plain.params)
