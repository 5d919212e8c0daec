"""Calibration: run a setting for real (`psrv run`), simulate the same setting with the job's compute
and the message time measured in that run, and report how far apart they are.

Taken from the real run's steps.csv: each simulated step's compute is the real run's, each rank's steps in order
(compute_seconds over that step's straggler factor, which the fault injector's seeded draws give, plus
the time the worker spent between steps: `--compute steps.csv`), and the same stragglers are put back;
one latency for a message is fitted (half the mean communication_seconds, less the time its bytes take
on the modelled links). The real steps' spread, not only their mean, matters: on a loaded machine the
slow tail of a step is part of the throughput and of the waits. model_ms (the mean undisturbed compute
less compute_ms) is reported. The rest of the setting is the run's own."""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

from psrv.experiments.harness.collect import read_csv, wait_fraction
from psrv.experiments.simulate.compute import step_parts
from psrv.experiments.simulate.config import SimulationConfig
from psrv.config import RunConfig, from_dict, to_dict

COMPARED = ("samples_per_second", "wait_fraction", "mean_staleness", "final_metric")
WITHIN = 0.15        # the agreement the docs ask for, relative to the real value
ABSOLUTE = {"wait_fraction": 0.02, "mean_staleness": 0.15}  # where the real value is near 0 (sync, async)


def real_config(cfg: SimulationConfig) -> RunConfig:
    """The run `cfg` simulates, as `psrv run` takes it."""
    data = to_dict(cfg)
    del data["simulate"]
    return from_dict(RunConfig, data)


def fit(cfg: SimulationConfig, steps: list[dict[str, str]]) -> dict[str, float]:
    """model_ms and latency_ms from a real run's steps.csv rows (see the module's docstring)."""
    parts = step_parts(steps, cfg.faults, cfg.seed).values()
    undisturbed = [seconds for compute, _ in parts for seconds in compute]
    between = [seconds for _, gaps in parts for seconds in gaps]
    comm = [float(row["communication_seconds"]) for row in steps]
    gap = statistics.fmean(between) if between else 0.0
    model_ms = max(0.0, 1000 * (statistics.fmean(undisturbed) + gap) - cfg.faults.compute_ms)
    from psrv.experiments.simulate.network import NetworkModel, job_plan
    plan, _ = job_plan(cfg.job.name, seed=cfg.seed, shards=cfg.cluster.servers)
    network = NetworkModel.of(cfg.simulate, plan, cfg.worker, seed=cfg.seed)
    on_links = sum(network.push_transfer) + sum(network.reply_transfer)  # a push and its reply, each crossing both links' bandwidth once
    latency_ms = max(0.0, 1000 * (statistics.fmean(comm) - on_links) / 2)
    return {"model_ms": model_ms, "latency_ms": latency_ms}


def _compared(summary: dict, wait: float | None) -> dict[str, float | None]:
    metric = summary.get("metric")
    final = (summary.get("eval_metrics") or {}).get(metric) if metric else None
    return {"samples_per_second": summary["samples_per_second"], "wait_fraction": wait,
            "mean_staleness": summary["mean_staleness"], "final_metric": final}


def agreement(real: dict, simulated: dict) -> dict[str, dict]:
    """Per compared value: real, simulated, the relative difference and whether they agree."""
    out = {}
    for key in COMPARED:
        r, s = real[key], simulated[key]
        if r is None or s is None:
            out[key] = {"real": r, "simulated": s, "relative": None, "agrees": None}
            continue
        relative = (s - r) / abs(r) if r else None
        agrees = abs(s - r) <= WITHIN * abs(r) or abs(s - r) <= ABSOLUTE.get(key, 0.0)
        out[key] = {"real": r, "simulated": s, "relative": relative, "agrees": agrees}
    return out


def calibrate(cfg: SimulationConfig, *, out: str | Path, progress: bool = False) -> dict:
    """Run `cfg` for real into DIR/real, then `compare`; return DIR/calibration.json's content."""
    from psrv.experiments.launcher.launch import run_local
    out = Path(out)
    load_before = os.getloadavg()
    run_local(real_config(cfg), out=out / "real", progress=progress)
    return compare(cfg, out=out, load=(load_before, os.getloadavg()))


def compare(cfg: SimulationConfig, *, out: str | Path, load: tuple | None = None) -> dict:
    """Fit the simulation to the real run of `cfg` in DIR/real, simulate it (learning level) into
    DIR/simulated, and write and return DIR/calibration.json."""
    from psrv.experiments.simulate.run import simulate
    out = Path(out)
    real = json.loads((out / "real" / "summary.json").read_text())
    steps = read_csv(out / "real" / "steps.csv")
    fitted = fit(cfg, steps)
    sim_cfg = cfg.replace(simulate=replace(cfg.simulate, level="learning", compute="steps.csv",
                                           compute_csv=str(out / "real" / "steps.csv"), **fitted))
    simulated = simulate(sim_cfg, out=out / "simulated")
    result = {"setting": {"mode": cfg.mode, "staleness": cfg.staleness if cfg.mode == "ssp" else None,
                          "workers": cfg.cluster.workers, "servers": cfg.cluster.servers,
                          "steps": cfg.job.steps, "compute_ms": cfg.faults.compute_ms,
                          "transient_stragglers": cfg.faults.transient_stragglers,
                          "straggler": cfg.faults.straggler},
              "fitted": fitted, "load_average": {"before": load[0], "after": load[1]} if load else None,
              "agreement": agreement(_compared(real, wait_fraction(steps)),
                                     _compared(simulated, simulated["wait_fraction"]))}
    (out / "calibration.json").write_text(json.dumps(result, indent=1))
    return result


def format_calibration(result: dict) -> str:
    def fmt(v):
        return "n/a" if v is None else f"{v:+.1%}" if isinstance(v, float) and abs(v) < 10 else f"{v:.4g}"
    lines = [f"{'':<20}{'real':>12}{'simulated':>12}{'difference':>12}  agrees"]
    for key, row in result["agreement"].items():
        real = "n/a" if row["real"] is None else f"{row['real']:.4g}"
        sim = "n/a" if row["simulated"] is None else f"{row['simulated']:.4g}"
        lines.append(f"{key:<20}{real:>12}{sim:>12}{fmt(row['relative']):>12}  {row['agrees']}")
    f = result["fitted"]
    load = result["load_average"]
    lines.append(f"fitted: model_ms {f['model_ms']:.3f}, latency_ms {f['latency_ms']:.3f}" + (
        f"; load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after" if load else ""))
    return "\n".join(lines)
