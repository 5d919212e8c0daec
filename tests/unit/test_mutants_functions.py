"""`make mutants --functions`: the globs it hands mutmut pick a function's or method's mutants and no other's."""
import fnmatch

from tests.conformance.mutants import globs_of

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
