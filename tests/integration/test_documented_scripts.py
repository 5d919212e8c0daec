"""The scripts a new user copies, read from the docs: the README's ten lines under `psrv run` as the README runs
them, and docs/scripts.md's whole script in a spec: sync, async, ssp and ddp variants over 2 seeds through
`psrv experiment`. Its ps.log_eval evaluations become each run's evals.csv, the report's held-out accuracy curves
and its time to the target; sync's final weights equal ddp's on the same seed to 1e-5 (the same mean gradient,
stepped by the shards or on every rank)."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch

from tests.helpers import psrv_argv, run_in_session

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("sync", "async", "ssp-1", "ddp")
SPEC = """\
name = "readme-script"
seeds = [0, 1]
[job]
script = "train.py"
steps = 60
[cluster]
workers = 2
servers = 1
[target]
eval_accuracy = 0.5
[[variants]]
mode = "sync"
[[variants]]
mode = "async"
[[variants]]
mode = "ssp"
staleness = 1
[[variants]]
mode = "ddp"
"""


def documented_script(doc: str, name: str) -> str:
    """The Python block of `doc` that starts with `# NAME`."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), flags=re.S)
    scripts = [b for b in blocks if b.startswith(f"# {name}\n")]
    assert len(scripts) == 1, f"{doc} should hold one ```python block starting with '# {name}'"
    return scripts[0]


@pytest.mark.timeout(120)
def test_the_readmes_ten_lines_run_as_the_readme_says(tmp_path):
    (tmp_path / "ten.py").write_text(documented_script("README.md", "ten.py"))
    command = re.search(r"`\.venv/bin/psrv (run [^`]*--script ten\.py)`", (ROOT / "README.md").read_text())
    assert command, "README.md should say how to run ten.py"
    proc = run_in_session(psrv_argv(*command.group(1).split(), "--no-progress"), timeout=100, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    s = json.loads((tmp_path / "runs" / "ten" / "summary.json").read_text())
    assert (s["mode"], s["num_workers"], s["steps"], s["complete"]) == ("sync", 2, 100, True)
    assert s["pushes"] == 200 and s["updates_applied"] == 100  # 100 steps of 2 workers, one update a clock
    with open(tmp_path / "runs" / "ten" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 200 and all(float(r["loss"]) > 0 and r["batch_size"] == "32" for r in rows)
    first, last = ([float(r["loss"]) for r in rows if lo <= int(r["step"]) < hi] for lo, hi in ((0, 10), (90, 100)))
    assert sum(last) / len(last) < 0.5 * sum(first) / len(first)  # it learns the teacher (2.24 -> 0.37 when written)


@pytest.mark.timeout(400)
def test_the_whole_script_runs_in_a_spec_under_every_mode_with_its_held_out_metrics(tmp_path):
    # stays slow (8 runs of `psrv experiment`, 22 processes each importing torch): the documented script is a
    # user's process by nature, every mode and both seeds are checked, and both seeds' sync == ddp
    (tmp_path / "train.py").write_text(documented_script("docs/scripts.md", "train.py"))
    (tmp_path / "spec.toml").write_text(SPEC)
    proc = run_in_session(psrv_argv("experiment", "spec.toml", "--out", "out"), timeout=380, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = tmp_path / "out"
    for variant in VARIANTS:
        for rep in (0, 1):
            run = out / variant / f"rep-{rep}"
            s = json.loads((run / "summary.json").read_text())
            assert (s["job"], s["seed"], s["steps"], s["complete"]) == ("train.py", rep, 60, True)
            with open(run / "evals.csv") as f:
                evals = list(csv.DictReader(f))
            assert [e["step"] for e in evals] == ["0", "20", "40", "60"], variant       # the script's log_eval calls
            if variant in ("sync", "ddp"):  # nothing moves the weights before rank 0's first step (a barrier, a
                # broadcast); in async and ssp rank 1 may push before rank 0's first pull (0.745 at step 0, once)
                assert float(evals[0]["eval_accuracy"]) < 0.3, (variant, evals[0])
            assert s["eval_accuracy"] >= 0.5, (variant, s)
            assert s["eval_accuracy"] == float(evals[-1]["eval_accuracy"])
            assert s["pushes"] == 120
    report = (out / "report.md").read_text()
    assert "plots/accuracy_curves.png" in report and (out / "plots" / "accuracy_curves.png").stat().st_size > 10_000
    with open(out / "summary.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(VARIANTS)
    for variant in VARIANTS:
        assert float(rows[variant]["time_to_target_seconds"]) > 0, rows[variant]
    for rep in (0, 1):
        sync, ddp = (torch.load(out / v / f"rep-{rep}" / "params.pt") for v in ("sync", "ddp"))
        assert sync.numel() == 20 * 64 + 64 + 64 * 10 + 10
        torch.testing.assert_close(sync, ddp, rtol=0, atol=1e-5)
    one, two = (torch.load(out / "sync" / f"rep-{rep}" / "params.pt") for rep in (0, 1))
    assert (one - two).abs().max() > 1e-3                                          # PSRV_SEED reached the script
