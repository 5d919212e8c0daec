"""tests/file_durations.py: a JUnit report's seconds summed per file, and the collection ordered by them,
longest file first, each file's tests kept together and in order."""
from types import SimpleNamespace

from tests.file_durations import longest_first, seconds_by_file


def test_seconds_are_summed_per_file_and_files_go_longest_first(tmp_path):
    report = tmp_path / "suite.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.unit.test_a" name="x" time="1.5"/>'
                      '<testcase classname="tests.unit.test_a" name="y" time="2.0"/>'
                      '<testcase classname="tests.integration.test_b" name="z" time="9"/>'
                      '</testsuite></testsuites>')
    table = seconds_by_file(report)
    assert table == {"tests/unit/test_a.py": 3.5, "tests/integration/test_b.py": 9.0}
    ids = ["tests/unit/test_a.py::x", "tests/new.py::n1", "tests/unit/test_a.py::y", "tests/integration/test_b.py::z",
           "tests/new.py::n2", "tests/other.py::o"]
    ordered = [i.nodeid for i in longest_first([SimpleNamespace(nodeid=i) for i in ids], table)]
    assert ordered == ["tests/integration/test_b.py::z", "tests/unit/test_a.py::x", "tests/unit/test_a.py::y",
                       "tests/new.py::n1", "tests/new.py::n2", "tests/other.py::o"]
