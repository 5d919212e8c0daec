"""What a case shows of the levels it claims (tests/conformance/live.py), both ways: a live level did its
work, an inert one none.

- path and protocol levels, by psrv's own counts: pushes that came in chunks, shard pushes sent during
  backward, bytes a payload plane carried, pulls the model computed on in the shard's memory; by the run's counts, which equal the reference's: the NaN pushed
  and dropped or refused, a backup worker's late pushes dropped;
- the wire dtype, outer dtype and pull codec, by the bytes: rank 0 pushed about 2 bytes an element of a
  dense push in bfloat16 or float16 (4 in float32), 1 in int8, half a byte in fp4, and each shard sent
  compressed pulls in under 90% of dense ones' bytes (their numbers are mostly under the tolerance in 4
  steps);
- the other numeric levels (live.MEASURED), by the reference (measure.py, when the plan is made): the
  weights at some other valid level of the axis would fail this case's check, so psrv, passing it, took
  this one. `check_measured` measures a case again (test_plan.py, for a sample of the plan): a level
  stored live still tells, one stored inert still does not, and one inert by the rules gives the very
  same weights."""
from __future__ import annotations

from tests.conformance.axes import DEFAULT, workers_of
from tests.conformance.live import MEASURED, PARAMS, inert
from tests.conformance.measure import alternatives, reference, seen

ELEMENT_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "fp4": 0.5}


def check_levels(case: dict, got, want, measured: dict | None = None) -> None:
    """Assert that every level of `case` did what live.py (and `measured`, the plan's measurements for
    this case) says: `got` the run's Outcome, `want` the reference's Expected."""
    dead = inert(case, measured)
    _path(case, got, dead)
    _counted(case, want, dead)
    _bytes(case, got)


def check_measured(case: dict, measured: dict | None = None) -> None:
    """Measure the case's numeric levels again against what the plan stored (`measured`)."""
    dead, want = inert(case, measured), reference(case, workers_of(case))
    for axis in MEASURED:
        if case[axis] != DEFAULT[axis]:
            _numeric(case, axis, want, dead, measured or {})


def _path(case: dict, got, dead: dict) -> None:
    chunked = [s.get("chunked_pushes", 0) for s in got.shards]
    live = case["chunks"] == "on" and "chunks" not in dead
    assert all(chunked) if live else not any(chunked), \
        f"chunks {case['chunks']} ({dead.get('chunks', 'live')}): chunked pushes per shard {chunked}"
    if got.early_sends:  # in-process only: psrv run's records hold no count of them
        live = case["overlap"] == "on" and "overlap" not in dead
        early = sum(got.early_sends.values())
        assert (early > 0) == live, f"overlap {case['overlap']} ({dead.get('overlap', 'live')}): {early} early sends"
    if got.in_place:  # in-process only, as early sends: every worker that closed computed on each pull in place
        live = case["in_place"] == "on" and "in_place" not in dead
        pulls = list(got.in_place.values())
        assert all(read > 0 and not copied for read, copied in pulls) if live else \
            not any(read or copied for read, copied in pulls), f"in_place {case['in_place']}: (read, copied) {pulls}"
    if case["plane"] != "inline":
        carried = [s.get("payload_bytes", {}).get(case["plane"], 0) for s in got.shards]
        live = "plane" not in dead
        assert all(carried) if live else not any(carried), f"the {case['plane']} plane carried {carried} bytes per shard"


def _counted(case: dict, want, dead: dict) -> None:
    fired = bool(want.counts["dropped"].get("invalid") or want.refused)
    live = case["nonfinite"] != "none" and "nonfinite" not in dead
    assert fired == live, f"nonfinite {case['nonfinite']} ({dead.get('nonfinite', 'live')}): the NaN fired: {fired}"
    late = bool(want.counts["dropped"].get("late"))
    live = bool(case["backup"]) and "backup" not in dead
    assert late == live, f"backup {case['backup']} ({dead.get('backup', 'live')}): late pushes dropped: {late}"


def _bytes(case: dict, got) -> None:
    """Rank 0's pushes' bytes an element where they are dense (no codec, nor onebit_adam's): its pushed
    bytes against 4 an element (psrv.Worker.wire_bytes: dense_push_bytes counts a fragment's elements only;
    rank 0, as rank 1 may push a NaN raw); each shard's pulls' bytes against dense ones'."""
    if case["codec"] == "none" and case["optimizer"] != "onebit_adam":
        quantised = case["local"] > 1 and case["outer"] != "float32"
        dtype = case["outer"] if quantised else case["wire"]
        w = got.wire[0]
        per = 4 * w["bytes_pushed"] / w["dense_push_bytes"]
        assert abs(per - ELEMENT_BYTES[dtype]) < 0.1 * ELEMENT_BYTES[dtype] + 0.02, \
            f"rank 0 pushed {per:.3f} bytes an element; {dtype} is {ELEMENT_BYTES[dtype]:g}"
    if case["fragments"] == 1:  # a fragment's pull carries that fragment only
        for shard, s in enumerate(got.shards):
            dense = 4 * _slice(shard, case["shards"]) * max(s["pulls"], 1)
            ratio = s["bytes_out"] / dense
            assert (ratio < 0.9) == (case["pull"] != "none"), \
                f"shard {shard} sent {ratio:.2f} of dense pulls' bytes; pull codec {case['pull']}"


def _slice(shard: int, shards: int) -> int:
    base, extra = divmod(PARAMS, shards)
    return base + (shard < extra)


def _numeric(case: dict, axis: str, want, dead: dict, measured: dict) -> None:
    workers, gaps = workers_of(case), []
    for level in alternatives(case, axis):
        other = reference({**case, axis: level}, workers)
        told, gap = seen(want, other)
        if axis in dead and axis not in measured:  # inert by the rules: the very same run (at its first other)
            assert gap == 0 and want.counts == other.counts, \
                f"{axis}={case[axis]} is inert ({dead[axis]}), yet {axis}={level} gives weights {gap:.3g} apart"
            return
        elif axis in measured:
            assert not told, f"{axis}={case[axis]} was measured inert ({measured[axis]}), yet {level} fails the check"
        elif told:
            return
        gaps.append(f"{level}: {gap:.3g}")
    assert axis in dead or not gaps, f"{axis}={case[axis]} is live, yet the weights at {', '.join(gaps)} " \
                                     "would pass this case's check: psrv could take either"
