"""The simulator against a real run made already (`psrv simulate --against RUN_DIR`): a network-bound run's
throughput predicted from the simulator's byte model, not fitted to it.

The setting is the run's own config.json. What the simulator does not model of it (the transport, where tensors
live, timeouts: experiments/simulate/config.py) is left at its default and named in the result. A run made on
emulated hosts (`network.bandwidth`, e.g. 200mbit) gives every simulated link that bandwidth. Each simulated
step's compute is one of the real run's steps (`--compute steps.csv`); the message latency is the simulator's
setting (`--latency-ms`, not fitted from the run's communication time, which would absorb what the byte model
misses). So the communication the simulation predicts comes from the sizes of the messages and, with
`--codec-cost measured` (the default), the codecs' CPU time as timed on this machine (codec_cost.py), not from
the run's own communication time.

Compared: samples/s over the steady steps, from the end of each worker's first step (which also pays for
connecting and the first dense pull) to the last step's end, in the real and the simulated steps.csv alike."""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from psrv.config import RunConfig, from_dict, to_dict
from psrv.config.base import default_of, leaves
from psrv.experiments.harness.collect import read_csv
from psrv.experiments.simulate.codec_cost import format_codec_cost
from psrv.experiments.simulate.config import SimulationConfig, is_simulated

WITHIN = 0.20  # the agreement issue asks of a network-bound run's samples/s
_RATE = {"kbit": 1e-6, "mbit": 1e-3, "gbit": 1.0}


def gbps(rate: str) -> float:
    """'200mbit' -> 0.2 (Gbit/s), as tc reads network.bandwidth."""
    number, unit = re.fullmatch(r"([0-9]+)(kbit|mbit|gbit)", rate).groups()
    return int(number) * _RATE[unit]


def steady_rate(rows: list[dict[str, str]]) -> float | None:
    """Samples per second from the end of the slowest worker's first step to the last step's end."""
    first: dict[str, float] = {}
    for row in rows:
        w, t = row["worker"], float(row["wall_time"])
        first[w] = min(first.get(w, t), t)
    if not rows or len(rows) <= len(first):
        return None
    start, end = max(first.values()), max(float(r["wall_time"]) for r in rows)
    samples = sum(int(r["batch_size"]) for r in rows if float(r["wall_time"]) > start)
    return samples / (end - start) if end > start else None


def simulation_of(run_dir: Path, **simulate: object) -> tuple[SimulationConfig, list[str]]:
    """The simulated setting of the run in `run_dir` (its `simulate` keys from `simulate`), and the keys of
    the run the simulator does not model, left at their defaults."""
    data = json.loads((run_dir / "config.json").read_text())
    data.pop("config_hash", None)
    bandwidth = (data.get("network") or {}).get("bandwidth") or ""
    dropped, flat = [], to_dict(from_dict(RunConfig, data))  # checked as the run it was
    for key, f, _ in leaves(RunConfig):
        if is_simulated(key):
            continue
        node = flat
        for part in key.split(".")[:-1]:
            node = node[part]
        if node[key.split(".")[-1]] != default_of(f):
            dropped.append(key)
            node[key.split(".")[-1]] = default_of(f)
    cfg = from_dict(SimulationConfig, flat)
    steps_csv = str(run_dir / "steps.csv")
    settings = {"level": "timing", "compute": "steps.csv", "compute_csv": steps_csv,
                **({"bandwidth_gbps": gbps(bandwidth)} if bandwidth else {}), **simulate}
    return cfg.replace(simulate=replace(cfg.simulate, **settings)), dropped


def script_plan(run_dir: Path, shards: int):
    """A script's run: its partition plan over `shards` from rank 0's record (`param_shapes`), and the job
    settings the simulation takes from the records (steps and batch size per worker, which the script chose,
    not its config). ValueError, in one line, where the records cannot say."""
    from psrv.partition import ParamSpec, PartitionPlan
    try:
        records = [json.loads(p.read_text()) for p in sorted(run_dir.glob("worker-*.json"))]
    except (OSError, ValueError) as exc:
        raise ValueError(f"--against {run_dir}: a worker record does not read ({exc})") from None
    shapes = next((r["param_shapes"] for r in records if r.get("param_shapes")), None)
    if shapes is None:
        raise ValueError(f"--against {run_dir}: a script's run whose records hold no param_shapes (made by an older "
                         "psrv); run it again to simulate it")
    steps, sizes = {r.get("steps") for r in records}, {r.get("batch_size") for r in records}
    if len(steps) != 1 or len(sizes) != 1 or None in steps | sizes:
        raise ValueError(f"--against {run_dir}: its workers differ in steps or batch size ({sorted(map(str, steps))}, "
                         f"{sorted(map(str, sizes))}), or a script passed none to step(batch_size=...); the simulator "
                         "gives every worker the same")
    plan = PartitionPlan(tuple(ParamSpec(f"p{i}", tuple(s)) for i, s in enumerate(shapes)), shards)
    return plan, {"steps": steps.pop(), "batch_size": sizes.pop()}


def against(run_dir: str | Path, *, out: str | Path, **simulate: object) -> dict:
    """Simulate the run in `run_dir` into DIR and compare their steady samples/s; DIR/against.json."""
    from psrv.experiments.simulate.run import simulate as run_simulation
    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "steps.csv").exists() or not (run_dir / "config.json").exists():
        raise ValueError(f"--against {run_dir}: not a finished run's folder (no steps.csv and config.json there)")
    restarts = None
    if "fail_down" not in simulate and _killed(run_dir):  # the restart's seconds, as the run's own logs say
        downs = restart_seconds(run_dir)
        if not downs:
            raise ValueError(f"--against {run_dir}: its kills' restarts are not in its logs (no 'takes rank R over' "
                             "line a restarted worker's life started before); give --fail-down SECONDS")
        simulate = {**simulate, "fail_down": statistics.mean(downs)}
        restarts = {"count": len(downs), "min": min(downs), "max": max(downs)}
    cfg, dropped = simulation_of(run_dir, **simulate)
    plan = None
    if cfg.job.script:  # no job to build: the model's shapes and the steps as the run's records say
        plan, job = script_plan(run_dir, cfg.cluster.servers)
        cfg = cfg.replace(job=replace(cfg.job, **job))
    summary = run_simulation(cfg, out=out, plan=plan)
    real, simulated = steady_rate(read_csv(run_dir / "steps.csv")), steady_rate(read_csv(out / "steps.csv"))
    relative = None if not real or simulated is None else (simulated - real) / real
    result = {"run": str(run_dir), "bandwidth_gbps": cfg.simulate.bandwidth_gbps,
              "latency_ms": cfg.simulate.latency_ms, "not_simulated": dropped,
              "codec_cost": cfg.simulate.codec_cost, "codec_cost_ms": summary["codec_cost_ms"],
              "codec_cost_load_average": summary["codec_cost_load_average"],
              "steady_samples_per_second": {"real": real, "simulated": simulated, "relative": relative,
                                            "agrees": None if relative is None else abs(relative) <= WITHIN},
              **{k: summary[k] for k in ("kills", "goodput", "goodput_end_to_end") if summary.get(k) is not None}}
    if "kills" in result:  # the real run's kills, beside the simulated ones: the same ranks, in the same order
        result["real_kills"] = real_kills(run_dir)
        result["fail_down"] = {"seconds": cfg.simulate.fail_down,
                               "from": "--fail-down" if restarts is None else "the run's logs", **(restarts or {})}
    (out / "against.json").write_text(json.dumps(result, indent=1))
    return result


def _killed(run_dir: Path) -> bool:
    cfg = json.loads((run_dir / "config.json").read_text())
    return bool((cfg.get("nemesis") or {}).get("schedule")) and bool((cfg.get("restarts") or {}).get("workers"))


_TAKEOVER = re.compile(r"a new process takes rank (\d+) over")
_STAMP = "%Y-%m-%d %H:%M:%S,%f"  # psrv's log lines begin with it (psrv/cli/main.py)


def _stamp(line: str) -> datetime | None:
    try:
        return datetime.strptime(line[:23], _STAMP)
    except ValueError:
        return None


def restart_seconds(run_dir: Path) -> list[float]:
    """Each restart's seconds in a run with killed and restarted workers: from its new life's first log line
    (DIR/worker-R.log, its dead lives' worker-R.log.1, .2, ...) to shard 0's 'a new process takes rank R over'."""
    starts: dict[int, list[datetime]] = {}
    for path in run_dir.glob("worker-*.log*"):
        rank = re.match(r"worker-(\d+)\.log", path.name)
        with open(path, errors="replace") as f:
            first = _stamp(f.readline())
        if rank and first is not None:
            starts.setdefault(int(rank[1]), []).append(first)
    server = run_dir / "server-0.log"
    downs = []
    for line in server.read_text(errors="replace").splitlines() if server.exists() else []:
        found, at = _TAKEOVER.search(line), _stamp(line)
        if found and at is not None:
            began = [t for t in starts.get(int(found[1]), []) if t <= at]
            if began:
                downs.append((at - max(began)).total_seconds())
    return downs


def real_kills(run_dir: Path) -> list[dict]:
    """The kills the run's nemesis made (DIR/nemesis.jsonl): their seconds and ranks."""
    path = run_dir / "nemesis.jsonl"
    lines = [json.loads(s) for s in path.read_text().splitlines() if s.strip()] if path.exists() else []
    return [{"at": e["at"], "rank": int(e["target"].split(":")[1])} for e in lines
            if e.get("ev") == "fault" and e.get("kind") == "kill" and e.get("done")]


def format_against(result: dict) -> str:
    row = result["steady_samples_per_second"]
    real = "n/a" if row["real"] is None else f"{row['real']:.4g}"
    sim = "n/a" if row["simulated"] is None else f"{row['simulated']:.4g}"
    rel = "n/a" if row["relative"] is None else f"{row['relative']:+.1%}"
    lines = [f"steady samples/s: real {real}, simulated {sim}, difference {rel} "
             f"(within {WITHIN:.0%}: {row['agrees']})",
             f"links {result['bandwidth_gbps']:g} Gbit/s, latency {result['latency_ms']:g} ms; compute: the run's "
             "own steps"]
    lines.append(format_codec_cost(result["codec_cost"], result["codec_cost_ms"], result.get("codec_cost_load_average")))
    if "kills" in result:
        sim = ", ".join(f"rank {k['rank']} at {k['t']:g}s" for k in result["kills"]) or "none"
        real = ", ".join(f"rank {k['rank']} at {k['at']}" for k in result["real_kills"]) or "none"
        lines.append(f"kills: simulated {sim}; the real run's {real}")
        down = result["fail_down"]
        lines.append(f"a killed worker down {down['seconds']:.2f}s (" + (
            "--fail-down" if down["from"] == "--fail-down" else
            f"the mean of the run's {down['count']} restarts in its logs, {down['min']:.2f} to {down['max']:.2f}s") + ")")
    if result.get("goodput") is not None:
        lines.append(f"simulated goodput {result['goodput']:.3f} while every worker ran, end to end "
                     f"{result['goodput_end_to_end']:.3f}, against the same run simulated clean")
    if result["not_simulated"]:
        lines.append("not simulated (left at defaults): " + ", ".join(result["not_simulated"]))
    return "\n".join(lines)
