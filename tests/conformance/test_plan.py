"""The stored plan (plan.json) still covers the axes: every case valid, every triple of the data-path
axes and every pair of levels of any two axes in some case, unless psrv refuses that pair (listed with
why). A new axis or level fails here until `python -m tests.conformance.covering` writes the plan again."""
from __future__ import annotations

import itertools

from tests.conformance.axes import AXES, DATA_PATH, DEFAULT, refusal
from tests.conformance.covering import all_pairs, load, pairs_of


def test_every_case_is_valid_and_names_every_axis():
    triples, pairs, _ = load()
    for case in triples + pairs:
        assert set(case) == set(AXES), f"the plan is older than the axes: {set(case) ^ set(AXES)}"
        assert all(case[a] in AXES[a] for a in AXES), case
        assert refusal(case) is None, (case, refusal(case))


def test_every_pair_is_covered_or_refused_by_psrv():
    triples, pairs, refused = load()
    covered = set().union(*(pairs_of(c) for c in triples + pairs))
    missing = all_pairs() - covered - set(refused)
    assert not missing, f"{len(missing)} pairs in no case, e.g. {sorted(missing, key=repr)[:3]}"
    for pair, why in refused.items():
        assert pair not in covered
        assert refusal({**DEFAULT, **dict(pair)}) is not None, f"{pair} is listed as refused, but psrv takes it"


def test_every_data_path_triple_is_covered():
    triples, pairs, _ = load()
    for axes in itertools.combinations(DATA_PATH, 3):
        seen = {tuple(c[a] for a in axes) for c in triples + pairs}
        for levels in itertools.product(*(AXES[a] for a in axes)):
            if refusal({**DEFAULT, "mode": "async", **dict(zip(axes, levels))}) is None:
                assert levels in seen, f"{dict(zip(axes, levels))} in no case"
