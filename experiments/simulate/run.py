"""One simulated run: build the models from the config, run the event loop, summarise, write."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from psrv.partition import PartitionPlan

from psrv.experiments.simulate import regions
from psrv.experiments.simulate.cluster import Cluster, Recorded
from psrv.experiments.simulate.codec_cost import CodecCost, codec_cost
from psrv.experiments.simulate.compute import ComputeModel
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.network import NetworkModel, job_plan
from psrv.experiments.simulate.overlap import compute_holds_encodes, overlaps, ready_order

log = logging.getLogger("psrv.simulate")


def simulate(cfg: SimulationConfig, *, out: str | Path | None = None, plan: PartitionPlan | None = None) -> dict:
    """Simulate `cfg`; return its summary (summary.json's keys, `simulated` True) and, with `out`, write
    DIR/summary.json, config.json, steps.csv (the sampled workers), evals.csv, DIR/plots and, at the
    learning level, params.pt (the final flat weights).

    The model's partition plan is the job's (cfg.job.name), or `plan`: a script's run (cfg.job.script) has
    no job to build, so its plan must be given (experiments/simulate/against.py reads it from the run's
    records), and only its timing is simulated. ValueError, in one line, for a script's config without one
    (its config also names the default job, which is not what its workers ran)."""
    sim, n = cfg.simulate, cfg.cluster.workers
    if cfg.job.script and (plan is None or sim.level == "learning"):
        raise ValueError(script_refusal(cfg.job.script))
    if plan is not None:
        job = None
    else:
        plan, job = job_plan(cfg.job.name, seed=cfg.seed, shards=cfg.cluster.servers)
    network = NetworkModel.of(sim, plan, cfg.worker, seed=cfg.seed)
    model = ComputeModel(sim, cfg.faults, seed=cfg.seed)
    codec = codec_cost(sim.codec_cost, cfg.worker, plan, seed=cfg.seed)  # timed before the clock starts
    started = time.perf_counter()
    learner = None
    if sim.level == "learning":
        from psrv.experiments.simulate.learning import Learner
        learner = Learner(cfg, job, plan)
    rec = _run(cfg, model, network, plan, codec, learner)
    if learner is not None:
        learner.finish(max(rec.end, default=0.0))
    clean = None
    if sim.goodput:  # the same run without failures or stragglers: goodput's baseline
        base = clean_config(cfg)
        clean = _run(base, ComputeModel(base.simulate, base.faults, seed=base.seed), network, plan, codec, None)
    elapsed = time.perf_counter() - started
    summary = summarise(cfg, rec, learner=learner, plan_total=plan.total, network=network, elapsed=elapsed,
                        codec=codec, clean=clean)
    log.info("simulated %d pushes in %.2fs", rec.pushes, elapsed)
    if summary["diverged"]:
        log.warning("the simulated training diverged (%s, N=%d): %s; summary.json says diverged: true",
                    cfg.mode, n, summary["diverged_why"])
    if out is not None:
        from psrv.experiments.simulate.outputs import write_outputs
        write_outputs(Path(out), cfg, summary, rec, evals=learner.evals if learner is not None else [])
        if learner is not None:  # as rank 0's --params-out: the flat weights after every push
            import torch
            torch.save(learner.final_weights, Path(out) / "params.pt")
    return summary


def clean_config(cfg: SimulationConfig) -> SimulationConfig:
    """`cfg` without failures, stragglers or goodput's second run: goodput's baseline."""
    import dataclasses
    return dataclasses.replace(
        cfg, simulate=dataclasses.replace(cfg.simulate, fail_mtbf=0.0, fail_down=1.0, shard_fail_mtbf=0.0,
                                          shard_fail_down=0.5, goodput=False),
        faults=dataclasses.replace(cfg.faults, straggler="", transient_stragglers=""),
        nemesis=dataclasses.replace(cfg.nemesis, schedule=""),
        restarts=dataclasses.replace(cfg.restarts, workers=0),
        server=dataclasses.replace(cfg.server, worker_timeout=type(cfg.server)().worker_timeout))


def _run(cfg: SimulationConfig, model: ComputeModel, network: NetworkModel, plan: PartitionPlan, codec, learner) -> Recorded:
    if cfg.hierarchy.tiered:
        return _run_regions(cfg, model, network, plan, codec)
    return _cluster(cfg, model, network, plan, codec, learner, range(cfg.cluster.workers)).run()


def _run_regions(cfg: SimulationConfig, model: ComputeModel, network: NetworkModel, plan: PartitionPlan,
                 codec) -> Recorded:
    """Each region's cluster, then its shards' syncs with the global ones (experiments/simulate/regions.py); the
    Recorded of all the regions' workers, with the syncs as its `hierarchy`."""
    sim, h = cfg.simulate, cfg.hierarchy
    clusters = [_cluster(cfg, model, network, plan, codec, None, ranks, record_updates=True)
                for ranks in regions.region_ranks(cfg.cluster.workers, h.regions)]
    records = [c.run() for c in clusters]
    rec = regions.merge(records, [r.start for r in regions.region_ranks(cfg.cluster.workers, h.regions)],
                        sim.sample_workers)
    rec.hierarchy = {"regions": h.regions, "region_every": h.region_every,
                     **regions.syncs([c.update_times for c in clusters], every=h.region_every,
                                     slice_bytes=[4.0 * (hi - lo) for lo, hi in plan.ranges],
                                     latency=sim.region_latency_ms / 1000.0,
                                     bandwidth=sim.region_bandwidth_gbps * 1e9 / 8,
                                     server_seconds=sim.server_ms / 1000.0)}
    return rec


def _cluster(cfg: SimulationConfig, model: ComputeModel, network: NetworkModel, plan: PartitionPlan, codec, learner,
             ranks: range, *, record_updates: bool = False) -> Cluster:
    """The cluster of the workers `ranks` (numbered from 0 in it) and the run's shards."""
    sim, n = cfg.simulate, len(ranks)
    compute = [model.times(w, cfg.job.steps) for w in ranks]
    failures = None
    if sim.fail_mtbf:
        from psrv.experiments.simulate.failures import Failures
        failures = Failures(n, mtbf=sim.fail_mtbf, down=sim.fail_down, seed=cfg.seed, steps=cfg.job.steps)
    elif cfg.nemesis.schedule:
        from psrv.experiments.simulate.kills import Kills
        failures = Kills(cfg.nemesis.schedule, workers=n, seed=cfg.seed, down=sim.fail_down,
                         restarts=cfg.restarts.workers, worker_timeout=cfg.server.worker_timeout)
    shard_failures = None
    if sim.shard_fail_mtbf:
        from psrv.experiments.simulate.shard_failures import ShardFailures
        shard_failures = ShardFailures(cfg.cluster.servers, mtbf=sim.shard_fail_mtbf, down=sim.shard_fail_down,
                                       seed=cfg.seed)
    cluster = Cluster(workers=n, shards=cfg.cluster.servers, mode=cfg.mode, staleness=cfg.staleness,
                      backup_workers=cfg.backup_workers, quorum=cfg.quorum, quorum_max_age=cfg.quorum_max_age,
                      quorum_grace=cfg.quorum_grace, quorum_grace_adaptive=cfg.quorum_grace_adaptive,
                      quorum_wait=cfg.quorum_wait,
                      steps=cfg.job.steps, local_steps=pushes_every(cfg.worker),
                      compute=compute, latency=network.latency, push_transfer=network.push_transfer,
                      reply_transfer=network.reply_transfer,
                      server_seconds=sim.server_ms / 1000.0, sample=sim.sample_workers,
                      batch_size=cfg.job.batch_size, learner=learner, codec=codec,
                      ready=ready_order(plan, sim.forward_fraction) if overlaps(cfg) else None,
                      compute_holds_encodes=sim.compute == "steps.csv" and compute_holds_encodes(sim.compute_csv),
                      failures=failures, fragments=cfg.worker.fragments, record_updates=record_updates,
                      shard_failures=shard_failures)
    return cluster


def script_refusal(script: str) -> str:
    return (f"job.script: {script} is a script's run: the simulator builds a model from a job (job.name) and a "
            "script's model is its own; `psrv simulate --against RUN_DIR` simulates the run's timing from its "
            "records (its parameter shapes and steps), or write the model as a job (job.name = "
            "\"path/file.py:factory\", docs/usage.md)")


def pushes_every(worker) -> int:
    """The steps between a worker's pushes: H with local steps, H/F under streaming DiLoCo's F fragments
    (one fragment a push; its reply is not overlapped with the next steps here: the worker waits for it)."""
    return worker.local_steps // worker.fragments


def useful(cfg: SimulationConfig, rec: Recorded) -> tuple[int, float]:
    """(useful samples: every step's but those of rounds some shard dropped and those a killed worker never did;
    their rate end to end)."""
    samples = (cfg.cluster.workers * cfg.job.steps - rec.dropped_steps - rec.skipped_steps) * cfg.job.batch_size
    return samples, samples / max(max(rec.end, default=0.0), 1e-12)


def useful_while_all_ran(cfg: SimulationConfig, rec: Recorded) -> float | None:
    """Useful samples/s from the first push to the first worker's last step: a real run's goodput span
    (docs/reliability.md, "Goodput"), where a step counts once its reply is back (a real run: once applied)."""
    if rec.first_push is None or rec.span_end is None:
        return None
    return rec.span_steps * cfg.job.batch_size / max(rec.span_end - rec.first_push, 1e-12)


def summarise(cfg: SimulationConfig, rec: Recorded, *, learner, plan_total: int, network: NetworkModel,
              elapsed: float, codec: CodecCost | None = None, clean: Recorded | None = None) -> dict:
    """summary.json of a simulated run: the keys a real run's has (docs/usage.md), where the simulation
    measures them, and the simulator's own (level, wait_fraction, histograms, codec_cost_ms: what the codecs
    were charged per message and shard, simulator_seconds)."""
    wall = max(max(rec.end, default=0.0), 1e-12)
    samples = cfg.cluster.workers * cfg.job.steps * cfg.job.batch_size
    stale = sum(k * v for k, v in rec.staleness.items())
    busy = rec.compute + rec.communication + rec.wait
    final = learner.final if learner is not None else {}
    kept, rate = useful(cfg, rec)
    while_all_ran = useful_while_all_ran(cfg, rec)
    return {
        "simulated": True, "complete": True, "level": cfg.simulate.level,
        "mode": cfg.mode, "staleness": cfg.staleness if cfg.mode == "ssp" else 0, "transport": "simulated",
        "job": cfg.job.script or cfg.job.name, "num_servers": cfg.cluster.servers * (cfg.hierarchy.regions if cfg.hierarchy.tiered else 1),
        "num_workers": cfg.cluster.workers,
        "steps": cfg.job.steps, "batch_size": cfg.job.batch_size, "backup_workers": cfg.backup_workers,
        "quorum": cfg.quorum, "quorum_max_age": cfg.quorum_max_age, "quorum_grace": cfg.quorum_grace,
        "quorum_grace_adaptive": cfg.quorum_grace_adaptive, "quorum_wait": cfg.quorum_wait, "local_steps": cfg.worker.local_steps,
        "optimizer": cfg.optimizer.name, "lr": cfg.optimizer.lr,
        "update_rule": cfg.optimizer.update_rule, "seed": cfg.seed,
        "initial_loss": final.get("initial_loss"), "final_loss": final.get("final_loss"),
        "eval_accuracy": final.get("eval_accuracy"), "eval_metrics": final.get("eval_metrics"),
        "metric": final.get("metric"), "lower_is_better": final.get("lower_is_better"),
        "diverged": final.get("diverged"), "diverged_why": final.get("diverged_why"),  # None: nothing trained
        "wall_seconds": wall, "samples_per_second": samples / wall,
        "pushes": rec.pushes, "updates_applied": rec.updates[0] if rec.updates else 0,
        "updates_applied_per_shard": rec.updates,
        "max_staleness": max(rec.staleness, default=0),
        "mean_staleness": stale / rec.pushes if rec.pushes else 0.0,
        "max_clock_gap": max(rec.clock_gap, default=0),
        "dropped": rec.dropped[0] if rec.dropped else 0,  # shard 0's, as a real run's summary (one push, S slices)
        "dropped_per_shard": list(rec.dropped), "lost_workers": [],
        "wait_seconds": rec.wait, "wait_fraction": rec.wait / busy if busy > 0 else None,
        "compute_seconds": rec.compute, "communication_seconds": rec.communication,
        "staleness_histogram": {str(k): v for k, v in sorted(rec.staleness.items())},
        "clock_gap_histogram": {str(k): v for k, v in sorted(rec.clock_gap.items())},
        "parameters": plan_total, "message_bytes": list(network.push_bytes),
        "reply_bytes": list(network.reply_bytes),
        "codec_cost": cfg.simulate.codec_cost,
        "codec_cost_ms": (codec or CodecCost.none(cfg.cluster.servers)).as_ms(),
        "codec_cost_load_average": codec.load_average if codec is not None else None,
        "sampled_workers": min(cfg.simulate.sample_workers, cfg.cluster.workers),
        "failures": rec.failures, "shard_failures": rec.shard_failures,
        "lost_samples": rec.lost_steps * cfg.job.batch_size,
        "dropped_samples": rec.dropped_steps * cfg.job.batch_size, "useful_samples": kept,
        "skipped_samples": rec.skipped_steps * cfg.job.batch_size,
        **({"kills": rec.kills} if cfg.nemesis.schedule else {}),
        "useful_samples_per_second_end_to_end": rate,
        "goodput_end_to_end": rate / useful(cfg, clean)[1] if clean is not None else None,
        "useful_samples_per_second": while_all_ran,
        "goodput": _ratio(while_all_ran, useful_while_all_ran(cfg, clean) if clean else None),
        "simulator_seconds": elapsed,
        **({"hierarchy": rec.hierarchy} if rec.hierarchy else {}),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
