"""`psrv run` with stderr to a pipe (a CI log): plain progress lines, a handful, and no redrawn bar."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.helpers import ROOT, psrv_argv

STEPS = 200


@pytest.mark.timeout(120)
def test_a_run_into_a_pipe_writes_a_few_plain_progress_lines(tmp_path):
    argv = psrv_argv("run", "--mode", "async", "--servers", "1", "--workers", "1", "--steps", str(STEPS),
                     "--job", "tests/conformance/job.py:tiny", "--compute-ms", "15", "--out", str(tmp_path / "run"))
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # bytes: '\r' kept as is
                         start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        out, err = (b.decode() for b in p.communicate(timeout=100))
    except subprocess.TimeoutExpired:
        p.terminate()  # psrv run stops the processes it started (each in a session of its own) by PID
        p.communicate(timeout=15)
        raise
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, err[-3000:]
    assert "\r" not in err, err[-2000:]  # no redraws: each would be a line of its own in a log
    lines = err.splitlines()
    progress = [line for line in lines if line.startswith("async x1: ")]
    assert 1 <= len(progress) <= 11, lines  # a line per tenth of the run at most, and the last says the end
    assert progress[-1].startswith(f"async x1: {STEPS}/{STEPS} steps (100%)"), progress
    assert len(lines) <= len(progress) + 10, lines  # a handful in all, not hundreds
    assert "summary.json" in out  # the summary still goes to stdout
