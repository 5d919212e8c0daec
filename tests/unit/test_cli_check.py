"""`psrv check RUN_DIR` as a user runs it: one line, and the exit status says clean, broken or nothing to check."""
import subprocess
import sys
from pathlib import Path

from tests.history_builder import ssp_case

ROOT = Path(__file__).resolve().parents[2]  # tests.helpers would import torch for nothing


def test_psrv_check_says_one_line_and_exits_0_clean_1_broken_2_nothing_to_check(tmp_path):
    clean, broken, empty = tmp_path / "clean", tmp_path / "broken", tmp_path / "empty"
    ssp_case(clean, slowest_leaves=True)
    ssp_case(broken, slowest_leaves=False)
    empty.mkdir()
    (empty / "config.json").write_text('{"mode": "sync"}')
    done = {d.name: subprocess.run([sys.executable, "-m", "psrv.cli", "check", str(d)], capture_output=True,
                                   text=True, timeout=60, cwd=ROOT) for d in (clean, broken, empty)}
    assert [done[n].returncode for n in ("clean", "broken", "empty")] == [0, 1, 2], done
    assert done["clean"].stdout.splitlines() == [f"{clean}: clean (ssp, rules 1-5): 2 acknowledged pushes, 2 "
                                                 "applied, 1 replicas, 1 epochs, 0 commits, 2 answered pulls"]
    line, = done["broken"].stdout.splitlines()
    assert line.startswith(f"{broken}: shard-0.") and ": rule 4 (the ssp bound): shard 0 answers worker 0's" in line
    assert done["broken"].stderr == ""
    assert done["empty"].stdout == ""
    assert done["empty"].stderr.splitlines() == [f"psrv check: error: {empty / 'history'} does not exist: the run "
                                                 "recorded no history (psrv run sets PSRV_HISTORY to DIR/history "
                                                 "for every process it starts)"]
