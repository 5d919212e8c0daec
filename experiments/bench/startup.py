"""startup: a run's start, launch to rank 0's first step, with its processes forked from the fork server
(experiments/launcher/forkserver.py) against each starting itself (importing torch), runs alternated.

python -m psrv.experiments.bench.startup --repeats 3 --out runs/bench/startup.json
ratio = median seconds to the first step forked / median started one by one (below 1: faster); the whole
run's seconds beside them. 2 shards and 4 workers, the issue's setting.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.launch import run_local


def _one(cfg: RunConfig, out: Path, *, fork_server: bool) -> tuple[float, float]:
    """(launch to rank 0's first step, launch to the run's end) in seconds."""
    started = time.time()
    run_local(cfg, out=out, progress=False, fork_server=fork_server)
    ended = time.time()
    first = json.loads((out / "worker-0.json").read_text())["step_log"][0]
    begun = first["wall_time"] - first["compute_seconds"] - first["communication_seconds"] - first["wait_seconds"]
    return begun - started, ended - started


def run(repeats: int = 3, *, servers: int = 2, workers: int = 4, steps: int = 100) -> list[dict]:
    cfg = from_dict(RunConfig, {"mode": "async", "cluster": {"servers": servers, "workers": workers},
                                "job": {"steps": steps}})
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="psrv-bench-startup-") as tmp:
        for i in range(repeats):
            for forked in (False, True):
                times[forked].append(_one(cfg, Path(tmp) / f"{forked}-{i}", fork_server=forked))
    first = {k: statistics.median(t for t, _ in v) for k, v in times.items()}
    whole = {k: statistics.median(t for _, t in v) for k, v in times.items()}
    return [{"bench": "startup", "servers": servers, "workers": workers, "steps": steps, "repeats": repeats,
             "forked_first_step_seconds": first[True], "started_first_step_seconds": first[False],
             "forked_run_seconds": whole[True], "started_run_seconds": whole[False],
             "ratio": first[True] / first[False]}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/startup.json"))
    args = parser.parse_args()
    rows = run(args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
