"""Measured traffic of a run's busiest process per training step (one step of every worker).

While the run trains, a sampler reads the TCP sockets of each of its processes (servers, workers, all-reduce
ranks) from the kernel, `ss -tinpH`: tcp_info bytes_sent and bytes_received summed over the sockets the
process's pid holds. After the run, the workers' step logs say how many steps were done at each sample's
time, and the rate between the first and the last sample taken while every worker was training is the
traffic per step: the start (initial weights, rendezvous) is left out, and a parameter server and an
all-reduce rank are measured the same way. A server also counts its own message bytes (server-K.json), a cross-check."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from bisect import bisect_right
from pathlib import Path

TRAFFIC_FILE = "traffic.json"
METHOD = ("`ss -tinpH` sampled every {interval:g} s while the run trains: tcp_info bytes_sent and "
          "bytes_received over the sockets of each process's pid, as a rate per training step between the "
          "first and the last sample taken while every worker was training (steps from the workers' step logs)")
_USERS = re.compile(r"pid=(\d+)")
_BYTES = re.compile(r"\bbytes_(sent|received):(\d+)")
_OUT = re.compile(r".*/((?:server|worker)-[0-9{}a-z]+)\.json$")


def socket_bytes() -> dict[int, tuple[int, int]]:
    """pid -> (bytes sent, bytes received) over its TCP sockets, from one `ss -tinpH`."""
    text = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=10, check=True).stdout
    out: dict[int, list[int]] = {}
    pids: list[int] = []
    for line in text.splitlines():
        if not line[:1].isspace():  # a socket's line, with its owners; its tcp_info line follows
            pids = [int(p) for p in _USERS.findall(line)]
            continue
        counts = dict(_BYTES.findall(line))
        for pid in pids:
            total = out.setdefault(pid, [0, 0])
            total[0] += int(counts.get("sent", 0))
            total[1] += int(counts.get("received", 0))
    return {pid: (s, r) for pid, (s, r) in out.items()}


def run_processes(run: Path) -> dict[int, str]:
    """pid -> 'server-K' or 'worker-R' of the processes writing into `run` (named by their --out file; an
    all-reduce rank's is worker-{rank}, so its RANK variable names it)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")]
            outs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out" and argv[i + 1].startswith(f"{run}/")]
            if not outs:
                continue
            name = _OUT.match(outs[0])
            if name is None:
                continue
            name = name.group(1)
            if "{rank}" in name:
                env = dict(item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
                name = name.replace("{rank}", env[b"RANK"].decode())
        except (OSError, KeyError, IndexError):  # it ended, or is not ours
            continue
        found[int(proc.name)] = name
    return found


class TrafficSampler:
    """A thread sampling the processes of the run in `run` until the `with` block ends; then it writes
    run/traffic.json. Where `ss` is missing nothing is sampled and the file says so."""

    def __init__(self, run: Path, *, interval: float = 0.2):
        self.run, self.interval = Path(run), interval
        self.available = shutil.which("ss") is not None
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="traffic-sampler", daemon=True)

    def __enter__(self) -> TrafficSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.available:
            self._stop.set()
            self._thread.join()
        data = {"method": METHOD.format(interval=self.interval) if self.available else "not measured: no `ss` here",
                "samples": self.samples}
        if self.run.is_dir():
            (self.run / TRAFFIC_FILE).write_text(json.dumps(data))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                procs = run_processes(self.run)
                if procs:
                    counts, t = socket_bytes(), time.time()
                    self.samples.append({"time": t, "bytes": {name: counts[pid] for pid, name in procs.items()
                                                              if pid in counts}})
            except (OSError, subprocess.SubprocessError, ValueError):
                continue  # a sample lost is a sample lost


def _training(run: Path) -> tuple[float, float, object]:
    """(start, end, steps_at) of the time every worker was training: from the last worker's first step
    to the first worker's last one; steps_at(t) is the steps done by then (all workers' logged steps ÷
    the number of workers)."""
    logs = [[row["wall_time"] for row in json.loads(p.read_text())["step_log"]] for p in run.glob("worker-*.json")]
    logs = [times for times in logs if times]
    if not logs:
        return 0.0, -1.0, lambda t: 0.0
    times = sorted(t for log in logs for t in log)
    return max(log[0] for log in logs), min(log[-1] for log in logs), lambda t: bisect_right(times, t) / len(logs)


def per_step(run: Path) -> dict[str, dict[str, float]]:
    """process -> {'in', 'out'} bytes per training step, from run/traffic.json; {} when not measured.
    Only samples taken while every worker was training count: before, the start's traffic; after, a
    closed socket's counters are gone from ss, so a sum over the open ones would fall."""
    try:
        samples = json.loads((run / TRAFFIC_FILE).read_text())["samples"]
    except (OSError, ValueError, KeyError):
        return {}
    start, end, steps_at = _training(run)
    samples = [s for s in samples if start <= s["time"] <= end]
    rates = {}
    for name in {name for s in samples for name in s["bytes"]}:
        points = [(steps_at(s["time"]), *s["bytes"][name]) for s in samples if name in s["bytes"]]
        if len(points) >= 2 and points[-1][0] > points[0][0]:
            steps = points[-1][0] - points[0][0]
            rates[name] = {"out": (points[-1][1] - points[0][1]) / steps, "in": (points[-1][2] - points[0][2]) / steps}
    return rates


def busiest(run: Path) -> dict[str, float | str] | None:
    """The busiest process's bytes in and out per step: the server (parameter server) or the rank
    (all-reduce) that moved the most; with a server's own message count for it; None if not measured."""
    rates = per_step(run)
    servers = {n: r for n, r in rates.items() if n.startswith("server-")}
    pool = servers or rates
    if not pool:
        return None
    name, top = max(pool.items(), key=lambda kv: kv[1]["in"] + kv[1]["out"])
    found = {"in": top["in"], "out": top["out"], "process": name}
    own = run / f"{name}.json"
    if servers and own.exists():
        record, steps = json.loads(own.read_text()), json.loads((run / "summary.json").read_text()).get("steps")
        if steps:
            found["own_count"] = (record["bytes_in"] + record["bytes_out"]) / steps
    return found
