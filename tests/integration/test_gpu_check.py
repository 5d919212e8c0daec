"""`make gpu-check` (experiments/bench/gpu_check.py) on a machine without CUDA: every GPU part says in one line that
it was skipped for lack of CUDA, nothing passes for it, and it exits 0; a rehearsal runs a GPU part on the CPU and
says its figures are not a GPU's. On a machine with CUDA these skip: there the check itself measures."""
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from psrv.experiments.bench import gpu_check
from tests.helpers import run_in_session

ROOT = Path(__file__).resolve().parents[2]
no_cuda_here = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, make gpu-check measures, for minutes")


@no_cuda_here
@pytest.mark.timeout(90)
def test_without_cuda_each_gpu_part_is_one_skipped_line_and_it_exits_0(tmp_path):
    proc = run_in_session([sys.executable, "-m", "psrv.experiments.bench.gpu_check", "--out", str(tmp_path)], timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:]
    skipped = {m.group(1): line for line in proc.stdout.splitlines() if (m := re.match(r"SKIPPED (\w+): ", line))}
    assert set(skipped) == set(gpu_check.PARTS), proc.stdout
    for part, line in skipped.items():
        assert "for lack of CUDA" in line and f"torch {torch.__version__}" in line, line
    assert not re.search(r"\bpass(ed)?\b|\bmet\b", proc.stdout, re.IGNORECASE), proc.stdout  # a skip is never a pass
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["results"] == [] and sorted(doc["said"]) == sorted(skipped.values())
    assert "gpu" not in doc["machine"] and doc["rehearsal"] is False and doc["work"] is None
    collected = doc["tests"]["gpu-marked, collected"]  # the GPU tests import and collect; each skips itself
    assert collected["returncode"] == 0 and re.fullmatch(r"\d+ skipped in [\d.]+s", collected["summary"]), collected
    assert "needs CUDA" in (tmp_path / "pytest-gpu.txt").read_text()
    report = (tmp_path / "results.md").read_text()
    assert all(f"- {line}" in report for line in skipped.values()) and "| figure |" not in report


@no_cuda_here
def test_a_rehearsal_runs_a_gpu_part_on_the_cpu_and_says_its_figures_are_not_a_gpus(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path), "--rehearse", "--parts", "apply"]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    rows = doc["results"]
    assert {(r["optimizer"], r["grad"]) for r in rows} == {(o, g) for o in ("sgd", "adam") for g in ("device", "host")}
    for r in rows:
        assert r["device"] == "cpu" and "goal" not in r, r  # no GPU goal is judged on the CPU's figures
        assert r["ratio"] == pytest.approx(r["bytes_per_second"] / r["copy_bytes_per_second"], rel=1e-12), r
    assert (tmp_path / "results.md").read_text().startswith("**REHEARSAL on the CPU: these are not GPU figures.**")
    assert doc["said"] == [] and list(doc["part_seconds"]) == ["apply"]


def test_the_gpu_test_selection_names_every_test_file_with_a_gpu_mark_or_a_cuda_branch():
    this = Path(__file__).relative_to(ROOT).as_posix()  # its own branch only skips it where CUDA is
    found = {p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").rglob("test_*.py"))
             if re.search(r"mark\.gpu|cuda\.is_available|cuda\.device_count", p.read_text())} - {this}
    assert found == set(gpu_check.GPU_TEST_FILES)
    assert all((ROOT / path.split("::")[0]).is_file() for paths in gpu_check.SUITE_NEEDS.values() for path in paths)


@pytest.mark.timeout(120)
def test_a_pytest_stopped_at_its_budget_still_prints_its_failures_and_counts_what_ran(tmp_path):
    """The suite part's pytest is interrupted at the budget as Ctrl-C would, so the failures that ran before it are
    in the log with their tracebacks (a kill, as before, kept only their names)."""
    (tmp_path / "test_budget.py").write_text(
        "import time\n\ndef test_fails():\n    assert 1 == 2, 'the failure message'\n\n"
        "def test_passes():\n    pass\n\ndef test_sleeps():\n    time.sleep(120)\n")
    log = tmp_path / "log.txt"
    # interrupted at 15 s, with 30 s to print (it prints within a second when it can): a quarter of the budget (5 s)
    # was once too short for a loaded suite, and 15 s once too (a fresh clone beside two busy loops; by hand, 1 of 8
    # runs beside three busy loops and the matrix starting took the whole 15 s)
    got = gpu_check.pytest(["-v", "--tb=short", "-n", "1", str(tmp_path / "test_budget.py")], log, 45, grace=30)
    assert got["returncode"] is None and got["summary"] == "stopped at the budget (45 s): 1 failed, 1 passed", got
    text = log.read_text()
    # on a kill, the log ends with where the interrupted controller waited (its threads, dumped by faulthandler)
    assert "AssertionError: the failure message" in text and "KeyboardInterrupt" in text, text[-8000:]


@pytest.mark.timeout(60)
def test_a_pytest_that_does_not_end_after_the_interrupt_is_killed_with_where_it_waited_in_the_log(tmp_path):
    """Killed when the grace runs out, and the log says where its controller waited (the thread dump comes from a
    copy of its stderr, so pytest's capture of a running test does not swallow it)."""
    (tmp_path / "test_hangs.py").write_text(
        "import time\n\ndef test_holds_on():\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n"
        "        time.sleep(60)\n")
    log = tmp_path / "log.txt"
    got = gpu_check.pytest([str(tmp_path / "test_hangs.py")], log, 12, grace=4)
    assert got["returncode"] is None and got["summary"] == "stopped at the budget (12 s)", got
    text = log.read_text()
    assert "no end 4 s after the interrupt" in text, text[-3000:]
    assert re.search(r'File ".*test_hangs\.py", line 7 in test_holds_on', text), text[-3000:]
