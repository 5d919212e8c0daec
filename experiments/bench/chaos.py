"""chaos: a long run under a seeded nemesis against its own fault-free baseline (make chaos, docs/benchmarks.md).

python -m psrv.experiments.bench.chaos                 # ~24 minutes of faults at the baseline's pace (make chaos)
python -m psrv.experiments.bench.chaos --minutes 4     # a short one: a smoke check of the same run

First the baseline: the job without faults for --baseline-minutes, whose useful samples/s (experiments/launcher/goodput) is
the yardstick. Then the chaos run, the same config with a nemesis: one fault every --every seconds (fixed
intervals, so the count is the run's length over the interval), its kind drawn from kill, pause and late_ack (and
partition as root, where emulated hosts are free), its target from primary:*, backup:*, worker:* and launcher,
all from --seed; killed workers come back (--restart-workers). Its steps are the baseline's pace times
--minutes, so it lasts --minutes over its goodput. Prints and writes DIR/chaos.json (a `make bench`-style row,
`python -m psrv.experiments.bench --markdown DIR/chaos.json` prints it as docs/benchmarks.md's table): the faults
by kind and target, the history checker's verdict, goodput, and each kind's mean cost. Exit status 1 when the
checker found a violation or the run gave no goodput.

Async, 8 workers, 2 shards with 2 backups each: 14 processes on this host's 2 cores. digits_mlp is small, and
--compute-ms 100 paces each worker's step (a sleep, not CPU), so the cores are not saturated and a fault's cost
is time lost, not CPU taken from the others; async so that a worker's fault stops that worker alone.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.netns import unavailable

KINDS = ("kill", "pause", "late_ack")
TARGETS = ("primary:*", "backup:*", "worker:*", "launcher")


def partition_why_not() -> str | None:
    """Why the run draws no partition here (None: it does)."""
    return unavailable()


def schedule(*, every: float, duration: float, kinds: tuple[str, ...], seed: int, law: str = "fixed") -> str:
    return f"every {every:g}s {law} {','.join(kinds)} on {','.join(TARGETS)} for {duration:g}s seed {seed}"


def config(*, steps: int, workers: int, servers: int, replicas: int, compute_ms: float, seed: int, nemesis: str,
           mode: str = "async", job: str = "digits_mlp", lr: float = 0.01) -> RunConfig:
    return from_dict(RunConfig, {
        "mode": mode, "seed": seed, "cluster": {"servers": servers, "replicas": replicas, "workers": workers},
        "job": {"name": job, "steps": steps, "batch_size": 32}, "optimizer": {"lr": lr, "momentum": 0.9},
        "faults": {"compute_ms": compute_ms}, "restarts": {"workers": 100}, "nemesis": {"schedule": nemesis}})


def run(out: Path, *, minutes: float, baseline_minutes: float, every: float, duration: float, seed: int,
        workers: int = 8, servers: int = 2, replicas: int = 2, compute_ms: float = 100.0, law: str = "fixed",
        partition: bool = True, say=print) -> dict:
    """The baseline, then the chaos run, in out/baseline and out/chaos; their row (also out/chaos.json)."""
    from psrv.experiments.launcher.goodput import baseline as measure_baseline
    from psrv.experiments.launcher.launch import RunFailed, run_local
    why_not = partition_why_not() if partition else "left out (--no-partition)"
    kinds = KINDS + (() if why_not else ("partition",))
    chaos = schedule(every=every, duration=duration, kinds=kinds, seed=seed, law=law)
    shape = dict(workers=workers, servers=servers, replicas=replicas, compute_ms=compute_ms, seed=seed)
    steps = max(50, round(baseline_minutes * 60 * 1000 / compute_ms))
    # the baseline runs where the chaos run does: on emulated hosts when it partitions (a partition never reached)
    idle = f"partition worker:1/primary:0 at step {steps + 1} for 1s" if not why_not else ""
    say(f"chaos: baseline, {steps} steps per worker, no faults -> {out / 'baseline'}")
    run_local(config(steps=steps, nemesis=idle, **shape), out=out / "baseline", progress=False)
    probe = config(steps=steps, nemesis=chaos, **shape)
    base = measure_baseline(out / "baseline", probe)
    pace = base["samples_per_second"] / (workers * 32)  # steps per second per worker
    steps = max(50, round(pace * minutes * 60))
    say(f"chaos: the baseline made {base['samples_per_second']:.0f} useful samples/s; the chaos run: {steps} steps "
        f"per worker, {chaos} -> {out / 'chaos'}" + (f" (partition: {why_not})" if why_not else ""))
    cfg, failed = config(steps=steps, nemesis=chaos, **shape), None
    try:
        summary = run_local(cfg, out=out / "chaos", progress=False, baseline=out / "baseline",
                            timeout=max(1800.0, minutes * 60 * 4))
        if summary.get("final_loss") is None:  # rank 0 died and its restart never joined: no final weights
            failed = "rank 0 wrote no record (no params.pt): it died and came back too late to join"
    except RunFailed as exc:  # what it recorded until then still says where the time went, and what was lost
        failed = str(exc).splitlines()[0]
        say(f"chaos: the run failed: {failed}; goodput and the check from what it recorded")
        summary = post_mortem(cfg, out / "chaos", base)
    row = _row(summary, schedule=chaos, minutes=minutes, partition=why_not or "drawn", failed=failed, **shape)
    write(out / "chaos.json", row)
    return row


def post_mortem(cfg: RunConfig, run: Path, base: dict) -> dict:
    """A failed run's summary as far as its folder tells: the nemesis's faults from DIR/nemesis.jsonl, the history
    checker's verdict (without the records a finished run writes) and goodput to where it stopped."""
    from psrv.experiments.launcher.goodput import faults_done, goodput
    from psrv.experiments.launcher.history import HistoryError, check_run
    from psrv.experiments.launcher.nemesis.record import JOURNAL, Record
    from psrv.experiments.launcher.replication import settle
    record = Record(run, 0.0)
    record.faults = [e for e in map(json.loads, (run / JOURNAL).read_text().splitlines()) if e["ev"] == "fault"]
    nemesis = record.summary(schedule=cfg.nemesis.schedule, seed=cfg.seed, not_reached=[])
    out: dict = {"mode": cfg.mode, "job": cfg.job.name, "wall_seconds": None, "faults": {"nemesis": nemesis}}
    settle(cfg, run)  # server-K.json: the record of the replica that served the shard last, as a finished run has
    try:
        out["history_check"] = check_run(run).to_dict()
        out["goodput"] = goodput(run, cfg, faults_done(out["faults"], 0.0), base)
    except HistoryError as exc:
        out.setdefault("history_check", {"ok": None, "error": str(exc)})
    return out


def _row(summary: dict, *, schedule: str, minutes: float, partition: str, failed: str | None, **shape) -> dict:
    nemesis, g = summary["faults"]["nemesis"], summary.get("goodput") or {}
    check = summary.get("history_check") or {}
    return {"bench": "chaos", "mode": summary["mode"], "job": summary["job"], **shape, "minutes": minutes,
            "schedule": schedule, "partition": partition, "failed": failed, "wall_seconds": summary["wall_seconds"],
            "faults": nemesis["done"], "not_done": nemesis["not_done"], "by_kind": nemesis["by_kind"],
            "by_target": nemesis["by_target"], "violations": len(check.get("violations", [])) if "ok" in check else None,
            "history_check": check.get("error") or ("clean" if check.get("ok") else (check.get("violations") or ["?"])[0]),
            "goodput": g.get("goodput"), "end_to_end_goodput": (g.get("end_to_end") or {}).get("goodput"),
            "samples_per_second": g.get("samples_per_second"),
            "baseline_samples_per_second": (g.get("baseline") or {}).get("samples_per_second"),
            "samples_lost": (g.get("samples") or {}).get("lost"), "samples_twice": (g.get("samples") or {}).get("twice"),
            "lost": g.get("lost"), "fault_cost_s": g.get("fault_cost_s"), "span_s": g.get("span_s"),
            "before_faults_s": g.get("before_faults_s"), "cost_by_kind": g.get("by_kind"),
            "cost_by_kind_target": g.get("by_kind_target"), "final_loss": summary.get("final_loss"),
            "eval_accuracy": summary.get("eval_accuracy"), "ratio": g.get("goodput") or 0.0}


def write(path: Path, row: dict) -> None:
    from psrv.experiments.bench.__main__ import judge, machine
    judge(row)
    path.write_text(json.dumps({"machine": machine(), "smoke": False, "results": [row]}, indent=1))


def report(row: dict) -> str:
    lines = [f"run             " + (f"FAILED: {row['failed']}" if row["failed"] else
                                 f"finished in {row['wall_seconds']:.0f} s of training"),
             f"faults done     {row['faults']} ({row['not_done']} not done); partition: {row['partition']}",
             "by kind         " + ", ".join(f"{k} {v['done']}" for k, v in row["by_kind"].items()),
             "by target       " + ", ".join(f"{k} {v['done']}" for k, v in sorted(row["by_target"].items())),
             f"history check   {row['history_check']}",
             f"goodput         {row['goodput']} ({row['samples_per_second']} useful samples/s against "
             f"{row['baseline_samples_per_second']}; end to end {row['end_to_end_goodput']})",
             f"samples         lost {row['samples_lost']} {row['lost']}, twice {row['samples_twice']}",
             f"fault cost      {row['fault_cost_s']} s of a {row['span_s']} s span ({row['before_faults_s']} s before "
             "the first fault)"]
    for name, c in (row["cost_by_kind_target"] or {}).items():
        lines.append(f"  {name:<26} {c['faults']:>4} faults, mean {c['mean_s']} s over the {c['costed']} costed, "
                     f"total {c['cost_s']} s")
    lines.append(f"final loss      {row['final_loss']}, accuracy {row['eval_accuracy']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=24.0, help="the chaos run's length at the baseline's pace "
                   "(it lasts that over its goodput); default %(default)s: 200 faults or more at --every 7")
    p.add_argument("--baseline-minutes", type=float, default=2.0, help="the fault-free run's length, about")
    p.add_argument("--every", type=float, default=7.0, help="seconds between faults (default %(default)s)")
    p.add_argument("--law", choices=("fixed", "exp"), default="fixed", help="the intervals: fixed, or exponential "
                   "with that mean")
    p.add_argument("--duration", type=float, default=2.0, help="seconds a pause, late ack or partition lasts")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-partition", action="store_true", help="draw no partition even as root")
    p.add_argument("--out", type=Path, default=Path("runs/chaos"), help="default: %(default)s")
    p.add_argument("--log-level", default="WARNING")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    a.out.mkdir(parents=True, exist_ok=True)
    row = run(a.out, minutes=a.minutes, baseline_minutes=a.baseline_minutes, every=a.every, duration=a.duration,
              seed=a.seed, law=a.law, partition=not a.no_partition, say=lambda s: print(s, file=sys.stderr))
    print(report(row))
    print(f"\nwrote {a.out / 'chaos.json'}", file=sys.stderr)
    return 0 if row["violations"] == 0 and row["goodput"] is not None and not row["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
