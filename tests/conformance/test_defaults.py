"""The reference takes no default from psrv: every setting it reads from a case's config, the case states
(tests/conformance/axes.py run_config), and its own values (ref_optim.DOCUMENTED, torch's and the papers';
ref_codecs.MIN_NUMEL) are psrv's defaults, save where psrv differs on purpose (ref_optim.PSRV_DIFFERS). So a
default of psrv's that drifts from torch's or a paper's fails here by name, as well as in the matrix."""
from __future__ import annotations

import pytest

from psrv.config import OptimConfig, Section, WorkerSettings, from_dict
from psrv.server.rules import dc
from tests.conformance import axes
from tests.conformance.covering import load
from tests.conformance.ref_codecs import MIN_NUMEL
from tests.conformance.ref_optim import DOCUMENTED, PSRV_DIFFERS
from tests.conformance.ref_streaming import reference_of


def psrv_default(key: str):
    """psrv's own value of DOCUMENTED[key] where a run does not give one."""
    if key == "dc_lambda":
        return {rule: OptimConfig(update_rule=rule).dc_lambda for rule in DOCUMENTED["dc_lambda"]}
    if key in ("dc_mean_square", "dc_eps"):
        return {"dc_mean_square": dc.MEAN_SQUARE_MOMENTUM, "dc_eps": dc.EPS}[key]
    return getattr(OptimConfig(name="sgd" if key in ("momentum", "nesterov") else "adam"), key)


@pytest.mark.parametrize("key", sorted(set(DOCUMENTED) - set(PSRV_DIFFERS)))
def test_psrv_defaults_are_the_documented_ones(key):
    assert psrv_default(key) == DOCUMENTED[key], f"psrv's default {key} is {psrv_default(key)!r}; torch's or the " \
        f"paper's is {DOCUMENTED[key]!r} (tests/conformance/ref_optim.py)"


@pytest.mark.parametrize("key", sorted(PSRV_DIFFERS))
def test_psrv_differs_where_it_says_it_does(key):
    """(The cases state these, so only this test sees psrv's default drift.)"""
    assert psrv_default(key) == PSRV_DIFFERS[key] != DOCUMENTED[key], \
        f"psrv's default {key} is {psrv_default(key)!r}; its docs say {PSRV_DIFFERS[key]!r}, torch's " \
        f"{DOCUMENTED[key]!r}"


def test_psrv_min_numel_is_the_references():
    assert WorkerSettings().compress_min_numel == MIN_NUMEL


class _Reads:
    """A config section that records the dotted key of every setting read from it."""

    def __init__(self, section: Section, seen: set[str], where: str = ""):
        self._section, self._seen, self._where = section, seen, where

    def __getattr__(self, name: str):
        value = getattr(self._section, name)
        key = f"{self._where}{name}"
        if isinstance(value, Section):
            return _Reads(value, self._seen, f"{key}.")
        self._seen.add(key)
        return value


def _keys(tree: dict, where: str = "") -> set[str]:
    return set().union(*(_keys(v, f"{where}{k}.") if isinstance(v, dict) else {f"{where}{k}"}
                         for k, v in tree.items()))


def _every_level_once(cases: list[dict]) -> list[dict]:
    """A few of `cases` that hold, together, every level of every axis that any of them holds."""
    left, chosen = {item for case in cases for item in case.items()}, []
    while left:
        best = max(cases, key=lambda case: len(left & set(case.items())))
        chosen.append(best)
        left -= set(best.items())
    return chosen


def test_every_setting_the_reference_reads_is_stated(monkeypatch):
    """The reference runs of a few cases of the plan (every level of every axis among them) read their
    configs through a recorder; each key they read is in run_config's tree."""
    trees = []

    def stated(cls, tree):
        trees.append(tree)
        return from_dict(cls, tree)

    monkeypatch.setattr(axes, "from_dict", stated)
    triples, pairs, _, _ = load()
    for case in _every_level_once(triples + pairs):
        cfg = axes.run_config(case)
        seen: set[str] = set()
        reference_of(_Reads(cfg, seen), nan=case["nonfinite"] != "none").run()
        unstated = seen - _keys(trees[-1])
        assert not unstated, f"{axes.case_id(case)}: the reference read {sorted(unstated)}, psrv's defaults"
