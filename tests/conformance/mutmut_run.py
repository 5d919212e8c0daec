"""`mutmut` with another test selection than pyproject.toml's, for `make mutants --cases`
(tests/conformance/mutants.py): the cases named in PSRV_MUTANT_CASES (a JSON list of pytest arguments) take the
place of [tool.mutmut] pytest_add_cli_args_test_selection, in mutmut's coverage pass and in each mutant's run.
mutmut reads its configuration once and forks every run from this process, so setting it here, before its
command line runs, holds for all of them.

    PSRV_MUTANT_CASES='["tests/conformance/test_topk_ties.py"]' python -m tests.conformance.mutmut_run run NAME...
"""
from __future__ import annotations

import json
import os
import sys

import mutmut.configuration

from tests.conformance.mutants import CASES


def select(cases: list[str]) -> None:
    mutmut.configuration.config().pytest_add_cli_args_test_selection = list(cases)


if __name__ == "__main__":
    select(json.loads(os.environ[CASES]))
    from mutmut.__main__ import cli

    sys.exit(cli())
