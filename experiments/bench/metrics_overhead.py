"""metrics_overhead: training steps/s of `psrv run` without and with --metrics, runs alternated.

python -m psrv.experiments.bench.metrics_overhead --steps 400 --repeats 3 --out runs/bench/metrics_overhead.json
With --metrics on, a scraper GETs every /metrics endpoint each --scrape-interval seconds, as Prometheus
would. steps/s counts every worker's steps over the training window (first step start to last step end,
so process start-up and imports are left out); overhead = median off / median on - 1, the fraction
the metrics add to the time of a step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from psrv.experiments.launcher.launch import run_local
from psrv.config import RunConfig, from_dict


class Scraper:
    """GETs every target in DIR/targets.json each `interval` seconds from a thread, like Prometheus."""

    def __init__(self, out: Path, interval: float):
        self.out, self.interval = out, interval
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Scraper:
        if self.interval > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                groups = json.loads((self.out / "targets.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            for target in (t for g in groups for t in g["targets"]):
                try:
                    with urllib.request.urlopen(f"http://{target}/metrics", timeout=1.0) as r:
                        r.read()
                    self.scrapes += 1
                except OSError:
                    pass


def instrument_costs(*, workers: int, repeats: int = 20000) -> dict:
    """CPU seconds the metrics calls add: per worker step, per push on a shard, and per scrape."""
    from prometheus_client import CollectorRegistry, generate_latest

    from psrv.metrics import ServerMetrics, WorkerMetrics
    from psrv.server.counters import ShardStats
    row = {"compute_seconds": 0.01, "communication_seconds": 0.002, "wait_seconds": 0.0, "batch_size": 32,
           "loss": 0.5, "staleness": 1}
    wm = WorkerMetrics(CollectorRegistry(), worker=0, mode="async")
    t0 = time.perf_counter()
    for _ in range(repeats):
        wm.observe_step(row)
    worker_step = (time.perf_counter() - t0) / repeats

    registry = CollectorRegistry()
    active, clocks = set(range(workers)), {w: 3 for w in range(workers)}

    def push_events(stats: ShardStats) -> float:   # what one PUSH_PULL makes a shard record
        t = time.perf_counter()
        for i in range(repeats):
            stats.received(1 << 16)
            stats.pushed(1e-4, 1)
            stats.applied(i)
            stats.answered(waited=0.0, gap=1)
            stats.membership(active, clocks)
            stats.sent(1 << 16)
        return (time.perf_counter() - t) / repeats
    server_push = push_events(ShardStats(metrics=ServerMetrics(registry, shard=0, mode="async"))) \
        - push_events(ShardStats())
    t0 = time.perf_counter()
    for _ in range(200):
        generate_latest(registry)
    server_scrape = (time.perf_counter() - t0) / 200
    return {"worker_seconds_per_step": worker_step, "server_seconds_per_push": server_push,
            "server_seconds_per_scrape": server_scrape}


def one_run(a: argparse.Namespace, out: Path, *, metrics: bool) -> dict:
    cfg = from_dict(RunConfig, {"mode": a.mode, "seed": a.seed, "cluster": {"servers": a.servers, "workers": a.workers},
                                "job": {"name": a.job, "steps": a.steps, "batch_size": a.batch_size}})
    with Scraper(out, a.scrape_interval if metrics else 0.0) as scraper:
        s = run_local(cfg, out=out, metrics=metrics, timeout=a.timeout, progress=False)
    steps = a.steps * a.workers
    return {"metrics": metrics, "steps_per_second": steps / s["wall_seconds"], "wall_seconds": s["wall_seconds"],
            "samples_per_second": s["samples_per_second"], "scrapes": scraper.scrapes, "out": str(out)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="steps per worker (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each variant (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--mode", default="async")
    p.add_argument("--job", default="digits_mlp")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scrape-interval", type=float, default=1.0,
                   help="with metrics on, scrape every endpoint this often (0: no scraping)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run")
    p.add_argument("--workdir", type=Path, default=None, help="where the runs go (default: a temporary dir)")
    p.add_argument("--out", type=Path, required=True, help="write the results (JSON) here")
    return p


def run(steps: int, repeats: int, workers: int = 2) -> list[dict]:
    """For `python -m psrv.experiments.bench`: ratio = median steps/s with metrics on / off (goal >= 0.98)."""
    argv = ["--steps", str(steps), "--repeats", str(repeats), "--workers", str(workers), "--out", "-"]
    r = measure(parser().parse_args(argv), argv)
    on, off = r["median_steps_per_second"]["on"], r["median_steps_per_second"]["off"]
    return [{"bench": "metrics_overhead", "job": r["job"], "mode": r["mode"], "steps": steps, "repeats": repeats,
             "steps_per_second_on": on, "steps_per_second_off": off, "ratio": on / off,
             "instrument_costs": r["instrument_costs"]}]


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    result = measure(a, argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    off, on = result["median_steps_per_second"]["off"], result["median_steps_per_second"]["on"]
    spread, per_step = result["range_steps_per_second"], result["instrument_costs"]["seconds_per_step"]
    costs = result["instrument_costs"]
    print(f"range of steps/s: off {spread['off'][0]:.2f}-{spread['off'][1]:.2f}, "
          f"on {spread['on'][0]:.2f}-{spread['on'][1]:.2f} (the noise the medians carry)")
    print(f"median steps/s: metrics off {off:.2f}, on {on:.2f}; overhead {100 * (off / on - 1):+.2f}% "
          f"of step time (goal < 2%); wrote {a.out}")
    print(f"metrics calls: {1e6 * per_step:.1f} us of CPU per worker step "
          f"({100 * costs['fraction_of_step_time']:.3f}% of its step time), "
          f"{1e3 * costs['server_seconds_per_scrape']:.2f} ms per scrape of a shard")
    return 0


def measure(a: argparse.Namespace, argv: list[str] | None) -> dict:
    """Alternate runs without and with metrics; the result main() writes."""
    with tempfile.TemporaryDirectory(prefix="psrv-metrics-bench-") as tmp:
        work = a.workdir or Path(tmp)
        runs = []
        for i in range(a.repeats):
            for metrics in (False, True):     # A B A B ...: drift in the machine's load hits both alike
                r = one_run(a, work / f"{i}-{'on' if metrics else 'off'}", metrics=metrics)
                runs.append(r)
                print(f"repeat {i} metrics={'on ' if metrics else 'off'} {r['steps_per_second']:8.2f} steps/s "
                      f"({r['wall_seconds']:.2f} s, {r['scrapes']} scrapes)", flush=True)
    off = statistics.median(r["steps_per_second"] for r in runs if not r["metrics"])
    on = statistics.median(r["steps_per_second"] for r in runs if r["metrics"])
    spread = {k: [r["steps_per_second"] for r in runs if r["metrics"] == (k == "on")] for k in ("off", "on")}
    costs = instrument_costs(workers=a.workers)
    # Each worker step records once on the worker and once on every shard (one PUSH_PULL per shard).
    per_step = costs["worker_seconds_per_step"] + a.servers * costs["server_seconds_per_push"]
    costs["seconds_per_step"] = per_step
    costs["fraction_of_step_time"] = per_step * off / a.workers   # a worker's step lasts workers/off s
    result = {"command": " ".join([os.path.basename(sys.executable), "-m", "psrv.experiments.bench.metrics_overhead",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "job": a.job, "mode": a.mode, "workers": a.workers, "servers": a.servers, "steps": a.steps,
              "repeats": a.repeats, "scrape_interval": a.scrape_interval, "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "runs": runs,
              "median_steps_per_second": {"off": off, "on": on}, "overhead": off / on - 1.0, "goal": 0.02,
              "range_steps_per_second": {k: [min(v), max(v)] for k, v in spread.items()},
              "instrument_costs": costs}
    return result


if __name__ == "__main__":
    sys.exit(main())
