"""`make mutants --functions` and `--cases`: the globs it hands mutmut pick a function's or method's mutants
and no other's; the cases must be conformance tests."""
import fnmatch

import pytest

from tests.conformance.mutants import globs_of, main

NAMES = ["psrv.server.pulls.copies.xǁPullCopiesǁanswer__mutmut_1",
         "psrv.server.pulls.copies.xǁPullCopiesǁanswer_fragment__mutmut_2",
         "psrv.server.pulls.copies.xǁPullCopiesǁload_state_dict__mutmut_3",
         "psrv.server.pulls.copies.xǁPullCopiesǁstate_dict__mutmut_4",
         "psrv.server.pulls.copies.x_config__mutmut_5",
         "psrv.server.pulls.copies.x__config__mutmut_6",
         "psrv.server.pulls.copies.x_within__mutmut_7"]


def picked(functions):
    globs = globs_of("psrv/server/pulls/copies.py", functions)
    return [n.rsplit("__mutmut_", 1)[1] for n in NAMES if any(fnmatch.fnmatchcase(n, g) for g in globs)]


def test_a_method_by_name_and_not_the_methods_whose_names_it_begins_or_ends():
    assert picked(["answer"]) == ["1"]
    assert picked(["state_dict"]) == ["4"]


def test_a_function_by_name_private_ones_included():
    assert picked(["_config"]) == ["6"]
    assert picked(["config"]) == ["5"]
    assert picked(["within", "load_state_dict"]) == ["3", "7"]


def test_no_functions_is_the_whole_file():
    assert picked(None) == ["1", "2", "3", "4", "5", "6", "7"]


def test_cases_must_be_conformance_tests_that_exist(capsys):
    """`--cases` narrows mutmut's test selection (tests/conformance/mutmut_run.py, run by `make mutants`): a path
    that is no conformance test file is refused in one line, before anything runs."""
    for bad in ("tests/conformance/no_such_test.py", "tests/unit/test_mutants_functions.py"):
        with pytest.raises(SystemExit) as stop:
            main(["--paths", "psrv/codecs/sparse.py", "--cases", bad])
        assert stop.value.code == 2
        assert f"--cases {bad}: give test files (or node ids) under tests/conformance/" in capsys.readouterr().err
