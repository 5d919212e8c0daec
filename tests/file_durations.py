"""The seconds each test file took in a whole run of the suite (tests/file_durations.json), so that `make test`
hands its two pytest-xdist workers the longest files first (conftest.py orders the collection by them, and
`--no-loadscope-reorder` keeps that order): xdist's own order, by the number of tests in a file, left the files
of a few long tests (the nemesis's, the RPC conformance cases) for last, where one of them ends the suite alone.

A file not in the table goes after those that are, in collection order; stale figures only cost balance, never
a test. Refresh them from a run's JUnit XML:

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/suite.xml
    .venv/bin/python -m tests.file_durations /tmp/suite.xml
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_durations.json")


def seconds_by_file(junit_xml: Path) -> dict[str, float]:
    """Each test file's summed test time in a JUnit XML report (the path from its testcases' class names)."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_xml).iter("testcase"):
        module = case.get("classname", "")
        if module:
            totals[module.replace(".", "/") + ".py"] += float(case.get("time") or 0.0)
    return dict(totals)


def load() -> dict[str, float]:
    try:
        return json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return {}


def longest_first(items: list, table: dict[str, float]) -> list:
    """`items` with whole files ordered by their recorded seconds, longest first (a stable sort: each file's
    tests keep their order, and unknown files theirs, after the known ones)."""
    return sorted(items, key=lambda item: -table.get(item.nodeid.split("::", 1)[0], 0.0))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.file_durations JUNIT_XML", file=sys.stderr)
        return 2
    table = {f: round(s, 1) for f, s in sorted(seconds_by_file(Path(argv[0])).items(), key=lambda x: -x[1])}
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {TABLE}: {len(table)} files, {sum(table.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
