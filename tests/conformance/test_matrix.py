"""The conformance matrix: the tiny job (tests/conformance/job.py) through every valid combination of
the data-path settings and a pairwise covering array over every setting (tests/conformance/covering.py),
each run for real (tests/conformance/cluster.py) and held against:

- the plain path: a case whose transport, plane, chunking or early sends differ from the plain ones
  must give rank 0 the very weights (bit for bit) of the same case on the plain path;
- the reference (tests/conformance/reference.py): the whole run's math, written from the papers in the
  test, to 1e-5;
- the counts: every shard's pushes, pushes applied, updates and drops by reason, and its staleness
  histogram, equal to the reference's recount of the same run, the summary's own sums consistent
  (pushes = applied + dropped), and every step's staleness as the worker saw it.
"""
from __future__ import annotations

import pytest
import torch

from tests.conformance.axes import case_id, plain_path, run_config
from tests.conformance.cluster import Outcome, run
from tests.conformance.covering import load
from tests.conformance.reference import Reference

TRIPLES, PAIRS, _ = load()
ATOL, RTOL = 1e-5, 1e-4
_runs: dict[str, Outcome] = {}


def outcome(case: dict) -> Outcome:
    key = case_id(case)
    if key not in _runs:
        _runs[key] = run(run_config(case), nan=case["nonfinite"] != "none")
    return _runs[key]


def check(case: dict) -> None:
    cfg = run_config(case)
    got = outcome(case)
    want = Reference(cfg, nan=case["nonfinite"] != "none").run()
    assert set(got.errors) == want.refused, f"refused workers {sorted(got.errors)}, expected {sorted(want.refused)}"
    for shard, s in enumerate(got.shards):
        mine = {k: s[k] for k in ("pushes", "pushes_applied", "updates_applied")} | {"dropped": s["dropped"]}
        assert mine == want.counts, f"shard {shard} counted {mine}; the run was {want.counts}"
        assert s["pushes"] == s["pushes_applied"] + sum(s["dropped"].values()), s
        hist = {int(k): v for k, v in s["staleness_histogram"].items()}
        assert hist == dict(want.staleness), f"shard {shard}: staleness {hist}, expected {dict(want.staleness)}"
    seen = {r: [i.staleness for i in infos] for r, infos in got.steps.items()}
    assert seen == {r: v for r, v in want.step_staleness.items()}, f"step staleness {seen} != {want.step_staleness}"
    assert bool(torch.isfinite(got.params).all()), "rank 0's weights are not finite"
    gap = (got.params - want.params).abs().max().item()
    assert torch.allclose(got.params, want.params, atol=ATOL, rtol=RTOL), f"{gap:.3g} from the reference"
    plain = plain_path(case)
    if plain != case:
        base = outcome(plain)
        diff = (got.params - base.params).abs().max().item()
        assert torch.equal(got.params, base.params), f"{diff:.3g} from the plain path's weights"


@pytest.mark.parametrize("case", TRIPLES, ids=case_id)
def test_data_path(case):
    check(case)


@pytest.mark.parametrize("case", [c for c in PAIRS if c["transport"] == "zmq"], ids=case_id)
def test_pairs(case):
    check(case)
