"""Where the suite's CPU goes: on 2 cores `make test` keeps both busy, so its time is CPU, and a test's wall time says
little about what it costs the others. Two measures, neither run by `make test`:

- per test: this module as a pytest plugin adds each test's CPU, its own process's (threads included) and its
  children's (those waited for: a process killed and left to init is not counted), to a JSON file per pytest
  process under DIR:

      .venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder -p tests.suite_cpu --cpu-out DIR

- per process: `python -m tests.suite_cpu sample OUT.json` reads every process's CPU from /proc twice a second
  until it is interrupted (or STOP, a file, appears), and keeps each process's last figure and command line.
  Started beside the suite, it counts what the first cannot: processes no test waits for, and which kind of
  process (a fork server, a forked shard, a user's script) spends it. Only processes started after it are counted.

`python -m tests.suite_cpu report DIR_OR_JSON` prints the files (or kinds of process) that spent the most.
"""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser) -> None:
    parser.addoption("--cpu-out", default=None, help="folder for each test's CPU seconds (tests/suite_cpu.py)")


_rows: list[tuple[str, float, float, float]] = []  # (test id, wall, own CPU, children's CPU)


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not item.config.getoption("cpu_out"):
        yield
        return
    (own, children), began = _cpu(), time.monotonic()
    yield
    own2, children2 = _cpu()
    _rows.append((item.nodeid, time.monotonic() - began, own2 - own, children2 - children))


def pytest_sessionfinish(session) -> None:
    out = session.config.getoption("cpu_out")
    if out and _rows:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"cpu-{os.getpid()}.json").write_text(json.dumps(_rows))


def sample(out: Path, stop: Path | None = None, every: float = 0.5) -> None:
    """Each process's CPU (user, system) and command line, read from /proc every `every` s, into `out` at the end."""
    tick = os.sysconf("SC_CLK_TCK")
    before = {pid for pid in os.listdir("/proc") if pid.isdigit()}
    seen: dict[str, list] = {}
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
    print("sampling", flush=True)  # what starts from now on is counted
    try:
        while not stopped and not (stop and stop.exists()):
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid in before:
                    continue
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    fields = stat[stat.rindex(")") + 2:].split()
                    key = f"{pid}:{fields[19]}"  # a pid with its start time: one process, though pids are reused
                    entry = seen.setdefault(key, ["", 0.0, 0.0])
                    entry[1], entry[2] = int(fields[11]) / tick, int(fields[12]) / tick
                    # read each time: a process seen between its fork and its exec shows its parent's command
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                        errors="replace").strip()[:300]
                    entry[0] = command or entry[0]
                except (OSError, ValueError, IndexError):
                    continue
            time.sleep(every)
    except KeyboardInterrupt:
        pass
    out.write_text(json.dumps(seen))


def kind(command: str) -> str:
    """What a process was, from its command line (a forked process shows the command it stands for)."""
    if " -c import sys;exec(eval(sys.stdin" in command or "execnet" in command:
        return "pytest-xdist worker (in-process tests)"
    module = re.search(r" -m (\S+)(?: (\w+))?", command)
    if module:
        name, sub = module.groups()
        if name == "psrv.cli":
            return f"psrv {sub}"
        return name
    console = re.search(r"/bin/psrv (\w+)", command)  # the console script: `psrv run ...`
    if console:
        return f"psrv {console.group(1)}"
    script = re.search(r"python\S* (\S+\.py)", command)
    if script:
        return f"script {Path(script.group(1)).name}"
    return "python -c" if " -c " in command else (command.split(" ")[0] or "?")


def _summed(items) -> dict[str, list[float]]:
    """(key, CPU, other) items -> {key: [how many, CPU, other]}, summed."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for key, cpu, other in items:
        entry = sums[key]
        entry[0] += 1
        entry[1] += cpu
        entry[2] += other
    return sums


def report(path: Path, top: int = 30) -> str:
    """The plugin's folder by test file (CPU, wall), or the sampler's file by kind of process (CPU, system)."""
    if path.is_dir():
        rows = [r for f in sorted(path.glob("cpu-*.json")) for r in json.loads(f.read_text())]
        sums = _summed((test.split("::")[0], own + children, wall) for test, wall, own, children in rows)
        head, line = f"{len(rows)} tests", "{cpu:7.1f} s CPU {other:7.1f} s wall {n:5d} tests  {name}"
    else:
        seen = json.loads(path.read_text())
        sums = _summed((kind(command), user + system, system) for command, user, system in seen.values())
        head, line = f"{len(seen)} processes", "{cpu:7.1f} s CPU ({other:5.1f} system) {n:5d} processes  {name}"
    lines = [f"{head}, {sum(e[1] for e in sums.values()):.0f} s of CPU"]
    for name, (n, cpu, other) in sorted(sums.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(line.format(cpu=cpu, other=other, n=n, name=name))
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "sample":
        sample(Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        print(report(Path(sys.argv[2])))
    else:
        sys.exit("usage: python -m tests.suite_cpu sample OUT.json [STOP] | report DIR_OR_JSON")
