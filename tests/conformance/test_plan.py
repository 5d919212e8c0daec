"""The stored plan (plan.json) still covers the axes: every case valid, every triple of the data-path
axes in some case, and every pair of levels of any two axes *live* in some case (tests/conformance/
live.py), unless the plan lists it: refused by psrv itself (its one-line ConfigError, not a rule of the
matrix's; or one of the matrix's own limits, axes.MATRIX_LIMITS) or dead (valid, but inert there, with
why). A new axis or level fails here until `python -m tests.conformance.covering` writes the plan again."""
from __future__ import annotations

import itertools

import pytest

from tests.conformance.axes import AXES, case_id, DATA_PATH, DEFAULT, MATRIX_LIMITS, refusal, refused_by_psrv
from tests.conformance.covering import all_pairs, dead_why, load
from tests.conformance.evidence import check_measured
from tests.conformance.live import live_pairs


def test_every_case_is_valid_and_names_every_axis():
    triples, pairs, _, _ = load()
    for case in triples + pairs:
        assert set(case) == set(AXES), f"the plan is older than the axes: {set(case) ^ set(AXES)}"
        assert all(case[a] in AXES[a] for a in AXES), case
        assert refusal(case) is None, (case, refusal(case))


def test_every_pair_is_live_in_a_case_or_listed_with_why():
    triples, pairs, unheld, measured = load()
    covered = set().union(*(live_pairs(c, measured.get(case_id(c))) for c in triples + pairs))
    missing = all_pairs() - covered - set(unheld)
    assert not missing, f"{len(missing)} pairs live in no case, e.g. {sorted(missing, key=repr)[:3]}"
    for pair, (kind, *_) in unheld.items():
        assert pair not in covered, f"{pair} is listed as {kind}, but a case holds it live"


def test_a_refused_pair_is_refused_by_psrv_itself():
    """The matrix refuses nothing on its own account but its listed limits: every other refused pair is
    psrv's ConfigError, whose line is the reason the plan gives."""
    _, _, unheld, _ = load()
    for pair, (kind, why, _) in unheld.items():
        if kind == "refused":
            case = {**DEFAULT, **dict(pair)}
            assert why in MATRIX_LIMITS.values() or refused_by_psrv(case) == why, (pair, why, refused_by_psrv(case))


def test_a_dead_pair_is_held_by_a_valid_case_where_it_is_inert():
    """A dead pair's witness: a valid case holding the pair, one of whose levels is inert there, for the
    reason the plan gives."""
    _, _, unheld, measured = load()
    for pair, (kind, why, witness) in unheld.items():
        if kind == "dead":
            assert refusal(witness) is None and dict(pair).items() <= witness.items(), (pair, witness)
            said = dead_why(pair, witness, measured.get(case_id(witness)))
            assert why and said == why, (pair, why, said)


SAMPLE = 8  # of the plan's cases: 10 to 25 s of reference runs


@pytest.mark.parametrize("index", range(SAMPLE))
def test_the_plans_measurements_still_hold(index):
    """Every len/SAMPLE-th case measured again (evidence.check_measured): the reference and the plan agree
    on which numeric levels the check can see. A change to the reference or to the cases' settings fails
    here until `python -m tests.conformance.covering` measures the plan again."""
    triples, pairs, _, measured = load()
    cases = triples + pairs
    case = cases[index * len(cases) // SAMPLE]
    check_measured(case, measured.get(case_id(case)))


def test_every_data_path_triple_is_covered():
    triples, pairs, _, _ = load()
    for axes in itertools.combinations(DATA_PATH, 3):
        seen = {tuple(c[a] for a in axes) for c in triples + pairs}
        for levels in itertools.product(*(AXES[a] for a in axes)):
            if refusal({**DEFAULT, "mode": "async", **dict(zip(axes, levels))}) is None:
                assert levels in seen, f"{dict(zip(axes, levels))} in no case"
