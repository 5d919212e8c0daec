"""`python -m experiments.bench --smoke`: every benchmark still runs, fast, and yields a finite ratio."""
import json
import math
import sys
import time

import pytest

from tests.helpers import run_in_session

KINDS = {"wire", "apply", "end_to_end", "scaling", "memory", "metrics_overhead"}


@pytest.mark.timeout(200)
def test_the_smoke_bench_runs_every_benchmark_quickly(tmp_path):
    out = tmp_path / "results.json"
    started = time.monotonic()
    proc = run_in_session([sys.executable, "-m", "experiments.bench", "--smoke", "--out", str(out)], timeout=180)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-4000:]
    doc = json.loads(out.read_text())
    assert doc["smoke"] is True and doc["machine"]["cores"] >= 1
    assert {r["bench"] for r in doc["results"]} == KINDS
    for r in doc["results"]:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r
    # Under a minute on an idle 2-core machine; the slack is for a machine shared with other work.
    assert took < 150, f"the smoke bench took {took:.0f}s"
