"""tests/suite_cpu.py, the suite's CPU measures: the plugin counts a test's own CPU and its children's, and the
report sums them by file; a process's kind is read from its command line, a forked one's included."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.suite_cpu import kind, report

ROOT = Path(__file__).resolve().parents[2]


def test_the_plugin_counts_a_tests_own_cpu_and_its_childrens(tmp_path: Path) -> None:
    (tmp_path / "test_spin.py").write_text(
        "import subprocess, sys, time\n"
        "def spin(seconds):\n"
        "    end = time.process_time() + seconds\n"
        "    while time.process_time() < end:\n"
        "        pass\n"
        "def test_own():\n"
        "    spin(0.3)\n"
        "def test_child():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.4\\n"
        "while time.process_time() < end: pass'], check=True)\n")
    out = tmp_path / "cpu"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.suite_cpu", "--cpu-out", str(out),
                           "-p", "no:cacheprovider", "test_spin.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [record] = out.glob("cpu-*.json")
    rows = {test: (own, children) for test, _, own, children in json.loads(record.read_text())}
    assert set(rows) == {"test_spin.py::test_own", "test_spin.py::test_child"}
    assert rows["test_spin.py::test_own"][0] >= 0.3 and rows["test_spin.py::test_own"][1] < 0.1
    assert rows["test_spin.py::test_child"][1] >= 0.4
    assert report(out).splitlines()[0].startswith("2 tests, ")


def test_a_process_is_named_by_what_it_runs() -> None:
    assert kind("/v/bin/python -P -m psrv.cli serve --config c.json") == "psrv serve"  # forked: its title
    assert kind("/v/bin/python /v/bin/psrv run --out x") == "psrv run"
    assert kind("/v/bin/python -P -m psrv.cli.forkserver 5") == "psrv.cli.forkserver"
    assert kind("/v/bin/python /tmp/x/train.py --lr 1") == "script train.py"
    assert kind("/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))") \
        == "pytest-xdist worker (in-process tests)"


def test_the_report_sums_processes_by_kind(tmp_path: Path) -> None:
    sampled = {"1:5": ["/v/bin/python -P -m psrv.cli serve", 1.0, 0.5], "2:6": ["/v/bin/python -P -m psrv.cli serve",
               2.0, 0.0], "3:7": ["/v/bin/python t.py", 0.25, 0.25]}
    (tmp_path / "procs.json").write_text(json.dumps(sampled))
    lines = report(tmp_path / "procs.json").splitlines()
    assert lines[0] == "3 processes, 4 s of CPU"
    assert lines[1].split() == ["3.5", "s", "CPU", "(", "0.5", "system)", "2", "processes", "psrv", "serve"]


def test_the_sampler_keeps_each_new_process_and_its_cpu(tmp_path: Path) -> None:
    out, stop = tmp_path / "procs.json", tmp_path / "stop"
    sampler = subprocess.Popen([sys.executable, "-m", "tests.suite_cpu", "sample", str(out), str(stop)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sampler.stdout.readline() == "sampling\n"
        subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.6\n"
                        "while time.process_time() < end: pass\ntime.sleep(2)", "spinner"], check=True, timeout=30)
        stop.touch()
        assert sampler.wait(10) == 0
    finally:
        sampler.kill()
    seen = json.loads(out.read_text())
    [(command, user, system)] = [v for v in seen.values() if v[0].endswith("spinner")]
    assert user + system >= 0.55 and kind(command) == "python -c"  # read while it sleeps, its spinning done
