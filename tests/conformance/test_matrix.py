"""The conformance matrix: the tiny job (tests/conformance/job.py) through every valid combination of
the data-path settings and a pairwise covering array over every setting (tests/conformance/covering.py),
each run for real (tests/conformance/cluster.py) and held against:

- the plain path: a case whose transport, plane, chunking, early sends or replicas differ from the plain
  ones must give rank 0 the very weights (bit for bit) of the same case on the plain path, and a case on
  three shards whose math is element by element those of one shard;
- with replicas: every backup followed its primary to the end (still among its live backups, no
  failover) and holds the primary's state leaf by leaf, bit for bit (weights, optimizer state, clocks,
  the exactly-once table), with the primary's counts (over torch RPC, whose backups are processes of
  `psrv run`, their counts and version);
- the reference (tests/conformance/reference.py; ref_streaming.py for streaming DiLoCo's fragments): the
  whole run's math, written from the papers in the test, to 1e-5;
- the levels (tests/conformance/evidence.py): each live one did its work (chunks sent, early sends made,
  the plane carried bytes, the NaN pushed and refused, a backup worker's push late, the weights moved by
  more than ten times the tolerance), each inert one (tests/conformance/live.py) none;
- the counts: every shard's pushes, pushes applied, updates and drops by reason, its staleness
  histogram and the lr scale its update rule gave each update, equal to the reference's recount of the
  same run, the summary's own sums consistent
  (pushes = applied + dropped), and every step's staleness as the worker's step rows hold it (a fragment
  push's in its own row, once answered).
"""
from __future__ import annotations

import pytest
import torch

from tests.conformance.axes import ATOL, RTOL, case_id, plain_path, run_config, workers_of
from tests.conformance.cluster import Outcome, one_thread, run  # noqa: F401 (one_thread: an autouse fixture)
from tests.conformance.covering import load
from tests.conformance.evidence import check_levels
from tests.conformance.ref_streaming import reference_of
from tests.states import assert_same_state

TRIPLES, PAIRS, _, MEASURED = load()
_runs: dict[str, Outcome] = {}



def outcome(case: dict, workers: int) -> Outcome:
    key = f"{case_id(case)}/{workers}"
    if key not in _runs:
        _runs[key] = run(run_config(case, workers=workers), nan=case["nonfinite"] != "none")
    return _runs[key]


def check(case: dict, got: Outcome | None = None) -> None:
    cfg = run_config(case)
    got = got or outcome(case, workers_of(case))
    want = reference_of(cfg, nan=case["nonfinite"] != "none").run()
    assert set(got.errors) == want.refused, f"refused workers {sorted(got.errors)}, expected {sorted(want.refused)}"
    for shard, s in enumerate(got.shards):
        mine = {k: s[k] for k in ("pushes", "pushes_applied", "updates_applied")} | {"dropped": s["dropped"]}
        assert mine == want.counts, f"shard {shard} counted {mine}; the run was {want.counts}"
        assert s["pushes"] == s["pushes_applied"] + sum(s["dropped"].values()), s
        assert s["lr_scale_histogram"] == want.lr_scales, f"shard {shard}: lr scales {s['lr_scale_histogram']}"
        hist = {int(k): v for k, v in s["staleness_histogram"].items()}
        assert hist == dict(want.staleness), f"shard {shard}: staleness {hist}, expected {dict(want.staleness)}"
    seen = {r: [row["staleness"] for row in rows] for r, rows in got.steps.items()}
    assert seen == {r: v for r, v in want.step_staleness.items()}, f"step staleness {seen} != {want.step_staleness}"
    assert bool(torch.isfinite(got.params).all()), "rank 0's weights are not finite"
    gap = (got.params - want.params).abs().max().item()
    assert torch.allclose(got.params, want.params, atol=ATOL, rtol=RTOL), f"{gap:.3g} from the reference"
    check_levels(case, got, want, MEASURED.get(case_id(case)))  # every level it claims live did its work, every inert one none
    check_backups(case, got)
    plain = plain_path(case)
    if plain != case:
        base = outcome(plain, workers_of(case))
        diff = (got.params - base.params).abs().max().item()
        assert torch.equal(got.params, base.params), f"{diff:.3g} from the plain path's weights"
    if case["shards"] > 1 and element_wise(case):
        one = outcome({**plain, "shards": 1}, workers_of(case))
        diff = (got.params - one.params).abs().max().item()
        assert torch.equal(got.params, one.params), f"{diff:.3g} from the weights of one shard"


def check_backups(case: dict, got: Outcome) -> None:
    """Each backup stayed live to the end of the run (its primary still lists it: never dropped for a late
    ack, never taking over) and holds exactly its primary's state and counts."""
    assert len(got.backups) == case["replicas"] * case["shards"], f"{len(got.backups)} backups ran"
    for b in got.backups:
        primary = got.shards[b.shard]
        assert b.address in primary["backups"], f"shard {b.shard}'s primary ended with backups {primary['backups']}"
        assert b.summary["role"] == "backup" and not b.summary["failovers"], f"shard {b.shard}: {b.summary['role']}"
        for key in ("version", "pushes", "pushes_applied", "updates_applied", "dropped", "staleness_histogram"):
            assert b.summary[key] == primary[key], f"shard {b.shard}'s backup: {key} {b.summary[key]} != {primary[key]}"
        if b.state is not None:  # a backup process's state (an RPC case's) is not in reach: its counts are
            assert_same_state(b.primary_state, b.state, f"shard {b.shard}")


def element_wise(case: dict) -> bool:
    """Is every number of this case computed element by element (so the shard count cannot change it)?
    Not with a codec either way (per shard range), an outer dtype of int8 or fp4 (per shard range too), nor
    onebit_adam's momenta (sign by default), nor heloco's cosines (per block of a shard's slice)."""
    return (case["codec"] == "none" and case["pull"] == "none" and case["outer"] not in ("int8", "fp4")
            and case["optimizer"] != "onebit_adam" and case["rule"] != "heloco")


@pytest.mark.parametrize("case", TRIPLES, ids=case_id)
def test_data_path(case):
    check(case)


# Cases where psrv and the reference disagree: each must still fail (strict), so a fix on either side shows at once;
# each is a defect to answer, not a pass (docs/architecture.md, "The conformance matrix").
DISAGREE: dict[str, str] = {}


@pytest.mark.parametrize("case", [c for c in PAIRS if c["transport"] == "zmq"], ids=case_id)
def test_pairs(case, request):
    if case_id(case) in DISAGREE:
        request.applymarker(pytest.mark.xfail(strict=True, reason=DISAGREE[case_id(case)]))
    check(case)
