"""tests/conformance/device_mutants.py, here without CUDA: every entry marked `cuda = true` is put in at one line,
and a mutant put into a copy of psrv is killed or survives by what the cases say (CPU cases stand in for the GPU
ones: the machinery is the same)."""
import dataclasses
import re

import pytest

from tests.conformance import device_mutants
from tests.conformance.mutant_report import EQUIVALENT, Entry, load_equivalent

INT8_DECODE = Entry("psrv/codecs/int8.py", "Int8.decode",
                    "scale_chunks_(out.copy_(q.to(out.device)), scales.to(out.device), chunk)",
                    "scale_chunks_(out.copy_(q.to(out.device)), scales.to(None), chunk)", "", cuda=True)


def test_every_marked_entry_is_put_in_at_one_line_and_parses():
    marked = device_mutants.marked(load_equivalent())
    assert len(marked) == EQUIVALENT.read_text().count("\ncuda = true\n") > 0 and all(e.cuda for e in marked)
    for e in marked:
        text = device_mutants.mutated(device_mutants.ROOT, e)
        assert e.mutant in text and text != (device_mutants.ROOT / e.file).read_text()


@pytest.mark.parametrize("entry, why", [
    (dataclasses.replace(INT8_DECODE, source="q.to(out.device)"), "is there 0 times"),
    (dataclasses.replace(INT8_DECODE, function="Int8.nowhere"), "defined 0 times"),
    (dataclasses.replace(INT8_DECODE, after="a line that is not above it"), "is there 0 times"),
    (dataclasses.replace(INT8_DECODE, mutant="scale_chunks_(out"), "does not parse")])
def test_an_entry_that_names_no_one_line_or_does_not_parse_is_refused(entry, why):
    with pytest.raises(ValueError, match=why):
        device_mutants.mutated(device_mutants.ROOT, entry)


# the machinery on a small file and its own cases (each run a pytest process, about 2.5 s of CPU)
REPLACE = Entry("psrv/atomic.py", "replacing", "os.replace(tmp, path)", "pass", "")
REORDERED = Entry("psrv/atomic.py", "replacing", "path.parent.mkdir(parents=True, exist_ok=True)",
                  "path.parent.mkdir(exist_ok=True, parents=True)", "")


@pytest.mark.timeout(240)
def test_a_mutant_the_cases_fail_is_killed_and_one_they_pass_survives(tmp_path):
    tests, slow = "tests/unit/test_atomic.py", ("test_a_durable_write_replaces_the_file_and_creates_its_folder",)
    failing, summary = device_mutants.baseline(tmp_path / "clean", tests=tests, workers=1)
    assert failing == [] and re.fullmatch(r"\d+ passed.* in [\d.]+s", summary), summary  # none fails unmutated
    killed = device_mutants.verdict(REPLACE, tmp_path / "killed", tests=tests, slow=slow)
    assert killed["status"] == "killed" and killed["exit_code"] == 1, killed
    assert killed["case"].startswith("tests/unit/test_atomic.py::")
    # the same call with its keywords in another order: every case passes, the slow stage too
    survived = device_mutants.verdict(REORDERED, tmp_path / "survived", tests=tests, slow=slow)
    assert survived["status"] == "survived" and survived["case"] is None, survived
    assert "1 passed" in survived["tail"]  # the slow stage's one case ran last
