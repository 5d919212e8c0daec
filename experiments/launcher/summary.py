"""summary.json, steps.csv and evals.csv of one run, built from the processes' own records."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from psrv.code_inputs import merged
from psrv.config import RunConfig

STEP_COLUMNS = ("wall_time", "worker", "step", "loss", "staleness", "compute_seconds",
                "communication_seconds", "wait_seconds", "batch_size", "pushed")
EVAL_COLUMNS = ("wall_time", "step", "eval_loss", "eval_accuracy")


def _records(out: Path, prefix: str, *, partial: bool = False) -> list[dict]:
    """The processes' records, by index. `partial` (an interrupted run): an unreadable one is skipped."""
    found = []
    for path in out.glob(f"{prefix}-*.json"):
        try:
            found.append((int(path.stem.split("-")[1]), json.loads(path.read_text())))
        except (ValueError, OSError):
            if not partial:
                raise
    return [record for _, record in sorted(found, key=lambda item: item[0])]


def _origin(workers: list[dict]) -> float:
    starts = [w["step_log"][0]["wall_time"] - w["step_log"][0]["compute_seconds"]
              - w["step_log"][0]["communication_seconds"] - w["step_log"][0]["wait_seconds"]
              for w in workers if w["step_log"]]
    return min(starts, default=0.0)


def _transport(cfg: RunConfig) -> str:
    if not cfg.is_allreduce:
        return cfg.cluster.transport
    return "nccl" if cfg.cluster.device.startswith("cuda") else "gloo"


def build_summary(cfg: RunConfig, out: Path, *, interrupted: bool = False, killed: int = 0,
                  failed: str | None = None) -> dict:
    """The run's summary (keys documented in docs/usage.md, "summary.json") from worker-*.json and server-*.json.

    A finished run must have every worker's record but those of the `killed` ranks (psrv run --kill-worker, not
    restarted; experiments/launcher/worker_restarts.py). An `interrupted` one is summarised from whatever
    records there are (a worker stopped before it wrote one has none; an interrupted worker's holds the
    steps it did): `complete` is then False and `steps_done` counts the worker steps that ran.

    A script's run (cfg.job.script: psrv run --script, or a spec's): the workers ran that loop, not the
    job, so `job` is the script and `script_args` its arguments, `steps` and `batch_size` are what the
    records say (None where the workers differ or the script did not say), and what the script did not
    report (held-out losses and metrics, without log_eval; samples where a step's batch size is unknown)
    is None, not made up. `seed` is the run's, handed to the script as PSRV_SEED.

    A `failed` run (psrv run ended by a death nothing survived, a stall, its timeout: experiments/launcher/launch.py) is
    summarised as an interrupted one, from the records there are, with `complete` and `interrupted` False and
    `cause` the failure's line."""
    partial = interrupted or failed is not None
    workers = _records(out, "worker", partial=partial)
    servers = _records(out, "server", partial=partial)
    if len(workers) != cfg.cluster.workers - killed and not partial:  # `killed`: ranks killed on purpose
        raise RuntimeError(f"expected {cfg.cluster.workers - killed} worker records in {out}, found {len(workers)}")
    rows = [r for w in workers for r in w["step_log"]]
    origin = _origin(workers)
    end = max((r["wall_time"] for r in rows), default=origin)
    wall = max(end - origin, 1e-9)
    rank0 = next((w for w in workers if w["rank"] == 0), {})
    # Rank 0's evaluations between steps are off the clock: in sync and the all-reduce modes every worker
    # waits for them, so their time leaves the span samples/s is taken over; in async and ssp the others
    # train on meanwhile and the span stands (only rank 0's own samples are fewer for it).
    paused = float(rank0.get("eval_seconds") or 0.0) if cfg.mode == "sync" or cfg.is_allreduce else 0.0
    # DDP has no staleness and no clock gap to measure (every rank steps on the same all-reduced
    # gradient): they are None there, not a 0 that reads like a measurement.
    measured = not cfg.is_allreduce
    # pushes only; a fragment push never answered (an interrupted worker's last) has None: not measured
    staleness = [r["staleness"] for r in rows if r.get("pushed", True) and r["staleness"] is not None] \
        if measured else []
    samples = None if any(w["samples"] is None for w in workers) else sum(w["samples"] for w in workers)
    ended = {"complete": False, "interrupted": True, "steps_done": len(rows)} if interrupted else {"complete": True}
    if failed is not None:
        ended = {"complete": False, "interrupted": False, "steps_done": len(rows), "cause": failed}
    elif not interrupted and not cfg.job.script and not rank0:  # its last life never joined (killed, restarted late)
        ended = {"complete": False, "interrupted": False, "steps_done": len(rows),
                 "cause": "rank 0 wrote no record (so no params.pt): it died and was not brought back in time"}
    summary = {
        **ended,
        "mode": cfg.mode, "staleness": cfg.staleness if cfg.mode == "ssp" else 0, "transport": _transport(cfg),
        "job": cfg.job.name, "num_servers": len(servers) if measured else 0, "num_workers": cfg.cluster.workers,
        "steps": cfg.job.steps, "batch_size": cfg.job.batch_size, "backup_workers": cfg.backup_workers,
        "quorum": cfg.quorum, "quorum_max_age": cfg.quorum_max_age, "quorum_grace": cfg.quorum_grace,
        "quorum_grace_adaptive": cfg.quorum_grace_adaptive, "quorum_wait": cfg.quorum_wait,
        "optimizer": cfg.optimizer.name, "lr": cfg.optimizer.lr, "seed": cfg.seed, "device": cfg.cluster.device,
        "freeze_step": cfg.optimizer.freeze_step if cfg.optimizer.name == "onebit_adam" else None,
        "wire_dtype": cfg.worker.wire_dtype, "overlap": cfg.worker.overlap,
        "initial_loss": rank0.get("initial_loss"), "final_loss": rank0.get("final_loss"),
        "eval_accuracy": rank0.get("eval_accuracy"), "eval_metrics": rank0.get("eval_metrics"),
        "metric": rank0.get("metric"), "lower_is_better": rank0.get("lower_is_better"),
        "wall_seconds": wall, "eval_seconds": paused,
        "samples_per_second": None if samples is None else samples / max(wall - paused, 1e-9),
        "pushes": sum(w["pushes"] for w in workers),
        **_local_steps(workers, samples),
        "early_sends": sum(w.get("early_sends", 0) for w in workers),
        **({"pulls_in_place": sum(w.get("pulls_in_place", 0) for w in workers),  # pull_in_place: what it did
            "pulls_copied": sum(w.get("pulls_copied", 0) for w in workers)} if cfg.worker.pull_in_place else {}),
        "updates_applied": servers[0]["updates_applied"] if servers else rank0.get("updates_applied", 0),
        "updates_applied_per_shard": [s["updates_applied"] for s in servers],
        "max_staleness": max(staleness, default=0) if measured else None,
        "mean_staleness": (sum(staleness) / len(staleness) if staleness else 0.0) if measured else None,
        "max_clock_gap": max((s["max_clock_gap"] for s in servers), default=0) if measured else None,
        "dropped": sum(sum(s["dropped"].values()) for s in servers[:1]),
        "dropped_per_shard": [sum(s["dropped"].values()) for s in servers],
        **_lr_scale(servers, cfg.optimizer.update_rule if measured else None),
        **_wire_bytes(workers, samples),
        "lost_workers": sorted({w for s in servers for w in s.get("lost_workers", [])}),
        "payload_bytes": _payload_bytes(servers),
        "wait_seconds": sum(r["wait_seconds"] for r in rows),
        "parameters": rank0.get("parameters"),
        "inputs": merged([w.get("inputs") for w in workers]),  # the code that ran (psrv/code_inputs.py)
    }
    if cfg.job.script:
        summary.update(job=cfg.job.script, script_args=list(cfg.job.script_args), steps=_common(workers, "steps"),
                       batch_size=_common(workers, "batch_size"), wire_dtype=rank0.get("wire_dtype"),
                       overlap=rank0.get("overlap"), device=rank0.get("device"),
                       # the keywords a rank's psrv.Worker(...) gave against config.json (psrv/client/run_settings.py)
                       settings_overridden={f"rank {w['rank']}": w["settings_overridden"] for w in workers
                                            if w.get("settings_overridden")})
    return summary


def _local_steps(workers: list[dict], samples: int | None) -> dict:
    """Local SGD / DiLoCo: `inner_steps` (all workers'), the mean pseudo-gradient norm over every push,
    and pushes per sample (against 1/batch_size when every step pushes); none without local steps."""
    if not any("inner_steps" in w for w in workers):
        return {}
    norms = [n for w in workers for n in w.get("pseudo_grad_norms", [])]
    pushes = sum(w["pushes"] for w in workers)
    return {"local_steps": _common(workers, "local_steps"), "inner_steps": sum(w.get("inner_steps", 0) for w in workers),
            "pseudo_grad_norm": sum(norms) / len(norms) if norms else None,
            "pushes_per_sample": pushes / samples if samples else None,
            "inner_steps_per_push": [_mean(w.get("inner_steps_per_push") or []) for w in workers]}


def _mean(values: list) -> float | None:
    """One worker's mean inner steps per push (local_steps 'auto:H' plans it per round)."""
    return round(sum(values) / len(values), 3) if values else None


def _wire_bytes(workers: list[dict], samples: int | None) -> dict:
    """The push and pull codecs and the bytes every worker measured on the wire (psrv.Worker.wire_bytes): pushed,
    pulled, the compression ratio (float32 push bytes / pushed bytes) and pushed+pulled per sample;
    None where a record has none (the all-reduce baselines)."""
    have = [w for w in workers if "bytes_pushed" in w]
    pushed = sum(w["bytes_pushed"] for w in have) if have else None
    pulled = sum(w["bytes_pulled"] for w in have) if have else None
    dense = sum(w.get("dense_push_bytes", 0) for w in have)
    return {"compress": _common(workers, "compress"), "error_feedback": _common(workers, "error_feedback"),
            "compress_pull": _common(workers, "compress_pull"), "bytes_pushed": pushed, "bytes_pulled": pulled,
            "compression_ratio": dense / pushed if pushed else None,
            "bytes_per_sample": (pushed + pulled) / samples if have and samples else None}


def _common(workers: list[dict], key: str):
    """The records' one value of `key`; None when they differ or say none."""
    values = {w.get(key) for w in workers}
    return values.pop() if len(values) == 1 else None


def _payload_bytes(servers: list[dict]) -> dict[str, int]:
    """The tensor bytes the shards received and sent, by the path they took: inline in zmq messages, or a
    payload plane (shm, bulk: psrv/transport/plane.py)."""
    total: dict[str, int] = {}
    for s in servers:
        for path, n in s.get("payload_bytes", {}).items():
            total[path] = total.get(path, 0) + n
    return total


def _lr_scale(servers: list[dict], rule: str | None) -> dict:
    """The servers' update rule (psrv/server/rules) and the lr scale it applied: the mean over every
    shard's optimizer steps, and shard 0's histogram (scale -> steps); what the rule did, summed over the
    shards (`rule_counts`); None for ddp."""
    steps = [(float(k), n) for s in servers for k, n in s.get("lr_scale_histogram", {}).items()]
    total = sum(n for _, n in steps)
    counts: dict[str, int] = {}
    for s in servers:  # what the rule did (heloco: blocks kept, shrunk, turned), every shard's summed
        for key, n in s.get("rule_counts", {}).items():
            counts[key] = counts.get(key, 0) + n
    return {"update_rule": rule, "mean_lr_scale": sum(k * n for k, n in steps) / total if total else None,
            "lr_scale_histogram": servers[0].get("lr_scale_histogram") if servers and rule else None,
            "rule_counts": counts if rule else None}


def write_tables(out: Path, *, interrupted: bool = False) -> None:
    """DIR/steps.csv (one row per worker step) and DIR/evals.csv, wall times relative to the start.

    A value a record does not have (DDP's staleness and `pushed`) is an empty cell. `pushed` is True or
    False on every parameter-server row: with local steps only every H-th step pushes, and a row's
    staleness counts only where it pushed. `interrupted`: from the records
    there are (see build_summary)."""
    workers = _records(out, "worker", partial=interrupted)
    origin = _origin(workers)
    rows = sorted((r for w in workers for r in w["step_log"]), key=lambda r: r["wall_time"])
    with open(out / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, STEP_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "wall_time": round(r["wall_time"] - origin, 6)})
    evals = next((w["evals"] for w in workers if w["rank"] == 0), [])
    extra = sorted({k for e in evals for k in e} - set(EVAL_COLUMNS))  # the job's other metrics, eval_<name>
    with open(out / "evals.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, EVAL_COLUMNS + tuple(extra), extrasaction="ignore")
        writer.writeheader()
        for e in evals:
            writer.writerow({**e, "wall_time": round(max(0.0, e["wall_time"] - origin), 6)})


def format_summary(s: dict) -> str:
    """The summary as an aligned two-column table for the terminal."""
    keys = ("mode", "staleness", "transport", "job", "num_servers", "num_workers", "steps", "batch_size",
            "initial_loss", "final_loss", "eval_accuracy", "wall_seconds", "samples_per_second", "pushes",
            "inner_steps", "pushes_per_sample", "pseudo_grad_norm",
            "updates_applied", "max_staleness", "mean_staleness", "max_clock_gap", "lost_workers")
    def fmt(v):
        return "n/a" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
    local = ("inner_steps", "pushes_per_sample", "pseudo_grad_norm")  # shown for local-steps runs only
    rows = [(k, s.get(k)) for k in keys if k in s or k not in local]
    if s.get("cause"):  # a run that ended without what it should have written says so first
        rows.insert(0, ("incomplete", s["cause"]))
    if s.get("eval_accuracy") is None and s.get("eval_metrics"):  # a job without accuracy: no n/a line
        rows = [row for row in rows if row[0] != "eval_accuracy"]
    at = next(i for i, (k, _) in enumerate(rows) if k == "final_loss") + 1
    others = [(f"eval_{name}", value) for name, value in (s.get("eval_metrics") or {}).items()
              if name not in ("loss", "accuracy")]  # the job's other metrics: perplexity, mse, ...
    rows[at:at] = others
    if s.get("diverged") is not None:  # a learning-level simulation: whether its training diverged, and why
        at = next(i for i, (k, _) in enumerate(rows) if k in ("eval_accuracy", "wall_seconds"))
        rows.insert(at + 1, ("diverged", f"yes: {s['diverged_why']}" if s["diverged"] else "no"))
    if s.get("settings_overridden"):  # a script's psrv.Worker(...) keywords that differ from config.json
        rows.append(("overridden", "; ".join(f"{rank}: " + ", ".join(f"{k}={o['script']!r} (run: {o['run']!r})"
                                                                     for k, o in kept.items())
                                             for rank, kept in s["settings_overridden"].items())))
    if "pulls_in_place" in s:  # --pull-in-place: the pulls the model computed on where they lay, and those copied
        rows.append(("pulls in place", f"{s['pulls_in_place']} (copied: {s['pulls_copied']})"))
    rows += _fault_rows(s.get("faults"))
    if s.get("replication"):  # psrv run --replicas: experiments/launcher/replication.py
        rows.append(("failovers", ", ".join(f"shard {f['shard']} to {f['new_primary']} at epoch {f['epoch']}"
                                            + (f", version {f['version']}" if "version" in f else "")
                                            for f in s["replication"]["failovers"]) or "none"))
    if s.get("simulated"):  # psrv simulate --goodput: ratios against its run without stragglers or failures
        if s.get("failures") or s.get("shard_failures"):  # --fail-mtbf or --nemesis, --shard-fail-mtbf
            rows.append(("failures", f"workers {s.get('failures', 0)} ({s.get('lost_samples', 0)} samples lost), "
                                     f"shards {s.get('shard_failures', 0)} (failed over, nothing lost)"))
        if "goodput" in s:
            rows.append(("goodput", f"{_share(s['goodput'])} (while every worker ran), end to end "
                                    f"{_share(s.get('goodput_end_to_end'))}, against the same run simulated clean"))
    else:
        rows += _goodput_rows(s.get("goodput"), s.get("history_check"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {fmt(v)}" for k, v in rows)


def _fault_rows(faults: dict | None) -> list[tuple[str, str]]:
    """What --kill-server and --kill-worker killed, which shards --checkpoint-every and workers --restart-workers
    brought back, what the shards lost, and what the nemesis did."""
    if not faults:
        return []
    killed = ", ".join(f"{k['process']} at worker 0's step {k['step']}" for k in faults["kills"] if k["killed"])
    resumed, updates = faults.get("resumed_from", {}), faults.get("lost_updates", {})
    restarted = ", ".join([f"{r['process']} from version {resumed.get(str(r['shard']))}" for r in faults["restarts"]]
                          + [f"{r['process']} at worker 0's step {r['step']}" + ("" if r["joined"] else " (too late to join)")
                             for r in faults.get("worker_restarts", [])])
    lost = ", ".join(f"shard {s}: {n} clocks, {updates.get(s)} updates" for s, n in faults["lost_clocks"].items())
    if faults.get("unrecorded_steps"):  # a killed life wrote no record: its steps are in no rate or count above
        restarted += (f" (the killed lives' {faults['unrecorded_steps']} steps wrote no record: not in samples/s, "
                      "pushes or steps.csv)")
    rows = [("killed", killed or "none"), ("restarted", restarted or "none"), ("lost", lost or "none")]
    died = [f"{d['process']} {d['cause']} "
            + ("before the workers started" if d.get("before_workers") else f"at worker 0's step {d['step']}")
            + (f", replaced by {d['replaced_by']}" if d.get("replaced_by") else "")
            for d in faults.get("dead_replicas", [])]
    died += [f"{d['process']} {d['cause']} at worker 0's step {d['step']}"
             + (f" ({d['steps_not_done']} of its steps not done)" if d.get("steps_not_done") is not None else "")
             + ("; the run went on without it" if d["survived"] else "; the run ended")
             for d in faults.get("deaths", [])]
    if died:  # every death: a replica's (its backup took over), a worker's left behind, the one that ended the run
        rows.append(("died", "; ".join(died)))
    nemesis = faults.get("nemesis")  # --nemesis: experiments/launcher/nemesis
    if nemesis:
        kinds = ", ".join(f"{kind} {n['done']}" for kind, n in nemesis["by_kind"].items() if n["done"])
        rows.append(("nemesis", f"{nemesis['done']} faults done{f' ({kinds})' if kinds else ''}, "
                                f"{nemesis['not_done']} not done: {nemesis['journal']}"))
    return rows


def _goodput_rows(g: dict | None, check: dict | None) -> list[tuple[str, str]]:
    """The goodput block (experiments/launcher/goodput) and the history checker's verdict, one line each."""
    rows = []
    if g is not None and "error" in g:
        rows.append(("goodput", f"n/a: {g['error']}"))
    elif g is not None:
        base = g["baseline"]
        rate = "n/a" if g["samples_per_second"] is None else f"{g['samples_per_second']:.0f}"
        whole = (g["end_to_end"] or {}).get("goodput")
        rows.append(("goodput", f"{rate} useful samples/s, no baseline (--goodput-baseline DIR)" if base is None else
                     f"{_share(g['goodput'])}: {rate} useful samples/s against {base['samples_per_second']:.0f} "
                     f"({base['run']}); end to end {_share(whole)}"))
        lost, twice = g["lost"], g["twice"]
        rows.append(("samples lost", f"{g['samples']['lost']} ({g['steps']['lost']} steps: {lost['unacknowledged']} "
                                     f"unacknowledged, {lost['dropped']} dropped, {lost['acknowledged']} acknowledged)"))
        rows.append(("samples twice", f"{g['samples']['twice']} ({twice['applied_twice']} steps applied twice, "
                                      f"{twice['redone']} redone)"))
        if g["fault_cost_s"] is not None:
            kinds = ", ".join(f"{k} {v['mean_s']:.2f} s" for k, v in g["by_kind"].items() if v["mean_s"] is not None)
            rows.append(("fault cost", f"{g['fault_cost_s']:.1f} s of {g['span_s']:.1f} s"
                                       + (f"; mean per fault: {kinds}" if kinds else "")))
    if check is not None:
        rows.append(("history check", check["error"] if "error" in check else "clean" if check["ok"] else
                     f"{len(check['violations'])} violations: {check['violations'][0]}"))
    return rows


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
