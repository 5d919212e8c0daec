"""peers: psrv against the parameter servers a user would otherwise write, on the same job, same run.

python -m psrv.experiments.bench.peers --repeats 3                 # every row (Ray: `pip install ray`)
python -m psrv.experiments.bench.peers --peers torch_rpc_example   # without Ray
Two peers, each the documented example in its own shape, on psrv's jobs (experiments/peers/):
- `ray`: Ray's parameter-server example (experiments/peers/ray_ps.py), sync and async, 2 workers; psrv's sync
  twice: as `psrv run` defaults, and with --pull-in-place (mode `sync-in-place`: Ray's side runs sync);
- `torch_rpc_example`: pytorch/examples' RPC parameter server (experiments/peers/rpc_ps.py), async, 1 trainer,
  the one count it runs with (its docstring says why).
psrv runs the same job, mode and worker count with 1 shard (`psrv run`'s defaults otherwise: co-located
processes share memory). Batches of 32, SGD lr 0.01 momentum 0.9 on both sides. Each repeat runs psrv, then
the peer, each in processes of its own; the ratio is psrv's median samples/s over the peer's (higher: psrv
faster), with both spreads (min to max over the repeats).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from psrv.config import RunConfig, from_dict
from psrv.experiments.bench.end_to_end import IN_PLACE, add_pulls, run_tree
from psrv.experiments.launcher.launch import run_local

STEPS = {"digits_mlp": 300, "synthetic_mlp": 100}
# (peer, job, mode, workers)
ROWS = tuple([("ray", job, mode, 2) for job in STEPS for mode in ("async", "sync", "sync-in-place")]
             + [("torch_rpc_example", job, "async", 1) for job in STEPS])
PEERS = {"ray": "psrv.experiments.peers.ray_ps", "torch_rpc_example": "psrv.experiments.peers.rpc_ps"}


def _psrv(job: str, mode: str, workers: int, steps: int, out: Path) -> dict:
    cfg = from_dict(RunConfig, {**run_tree(mode), "cluster": {"servers": 1, "workers": workers},
                                "job": {"name": job, "steps": steps, "batch_size": 32},
                                "optimizer": {"lr": 0.01, "momentum": 0.9}})
    summary = run_local(cfg, out=out, progress=False)
    if not summary["complete"]:
        raise RuntimeError(f"peers: psrv's {job} {mode} run did not complete")
    return summary


def _peer(peer: str, job: str, mode: str, workers: int, steps: int, out: Path) -> float:
    cmd = [sys.executable, "-m", PEERS[peer], "--job", job, "--workers", str(workers), "--steps", str(steps),
           "--out", str(out)] + (["--mode", mode.removesuffix(IN_PLACE)] if peer == "ray" else [])
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
        raise RuntimeError(f"peers: {peer} {job} {mode} failed (exit {proc.returncode}): {last}")
    return json.loads(out.read_text())["samples_per_second"]


def run(rows=ROWS, repeats: int = 3, steps: dict[str, int] | None = None) -> list[dict]:
    steps = {**STEPS, **(steps or {})}
    if any(peer == "ray" for peer, *_ in rows) and importlib.util.find_spec("ray") is None:
        raise RuntimeError("peers: the Ray rows need Ray: pip install -e '.[peers]' (make bench installs it), "
                           "or --peers torch_rpc_example")
    results = []
    with tempfile.TemporaryDirectory(prefix="psrv-peers-") as d:
        for peer, job, mode, workers in rows:
            ours, theirs, pulls = [], [], {}
            for rep in range(repeats):
                tag = f"{peer}-{job}-{mode}-{rep}"
                summary = _psrv(job, mode, workers, steps[job], Path(d) / f"psrv-{tag}")
                ours.append(summary["samples_per_second"])
                add_pulls(pulls, summary)
                theirs.append(_peer(peer, job, mode, workers, steps[job], Path(d) / f"{tag}.json"))
            med, base = statistics.median(ours), statistics.median(theirs)
            results.append({"bench": "peers", "peer": peer, "job": job, "mode": mode, "workers": workers, "servers": 1,
                            "steps": steps[job], "repeats": repeats, "samples_per_second": med,
                            "baseline_samples_per_second": base, "ratio": med / base,
                            "spread": [min(ours), max(ours)], "baseline_spread": [min(theirs), max(theirs)],
                            **pulls})
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", nargs="+", choices=sorted(PEERS), default=sorted(PEERS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    results = run(tuple(r for r in ROWS if r[0] in a.peers), a.repeats)
    for r in results:
        print(f"{r['peer']:>17} {r['job']:>13} {r['mode']:>13} x{r['workers']}: psrv {r['samples_per_second']:7.0f} "
              f"samples/s vs {r['baseline_samples_per_second']:7.0f}: {r['ratio']:.2f}x")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
