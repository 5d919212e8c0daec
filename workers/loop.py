"""The shipped worker loop (`psrv worker`): a job's batches through psrv.Worker. One call: `train(cfg)`.

psrv.Worker does HELLO, INIT, the first pull, the pushes (overlapped with backward), rank 0's final
pull and LEAVE; this loop adds the job, emulated faults, rank 0's evaluations, the step log, metrics
and progress. Ctrl-C (KeyboardInterrupt) anywhere between HELLO and the end leaves every shard, so
the other workers' barriers go on without this one, and raises `TrainingInterrupted` with the record
so far."""
from __future__ import annotations

import logging
import time

import torch
from torch.nn.utils import parameters_to_vector

from psrv.config import WorkerConfig
from psrv.rss import peak_rss_bytes
from psrv.worker import Worker
from psrv.workers.faults import FaultInjector
from psrv.workers.evals import record_eval, record_final
from psrv.workers.jobs import batch_size_of, load_job
from psrv.workers.local_steps import inner_steps, make_inner_optimizer

log = logging.getLogger("psrv.worker")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, where the entry point makes it one) stopped `train`. The worker has already
    sent LEAVE to every shard (best effort, bounded by 2 s). `record` is its record so far:
    `interrupted` True, `steps_done`, the rows of the steps done; `interrupt` is the
    KeyboardInterrupt that stopped it (psrv.process.Interrupted says which signal)."""

    def __init__(self, record: dict, interrupt: KeyboardInterrupt):
        super().__init__(f"worker {record['rank']}: interrupted at step {record['steps_done']}")
        self.record, self.interrupt = record, interrupt


def train(cfg: WorkerConfig, *, metrics=None, progress=None) -> dict:
    """Train cfg.job.steps steps against the servers; return this worker's record (see `psrv worker --out`).
    Raises TrainingInterrupted (a KeyboardInterrupt, after LEAVE) on Ctrl-C.

    With local steps (cfg.local_updates) a step is an inner step of this worker's own optimizer, one
    step-log row each (`pushed`: whether it pushed); every cfg.local_steps-th pushes the pseudo-gradient,
    and the record's `pushes` counts those pushes (the last, partial round's included).

    Rank 0's evaluations between steps (--eval-every) are off its clock: no row holds them and
    train_seconds leaves out their `eval_seconds`. In sync the other workers' next push still waits for
    them at the servers (their wait_seconds), as nothing stops the other workers meanwhile."""
    started = time.time()
    device = torch.device(cfg.device)
    job = load_job(cfg.job.name, seed=cfg.seed)
    model = job.model.to(device)
    faults = FaultInjector(cfg.faults, rank=cfg.rank, seed=cfg.seed)
    batches = job.batches_for(rank=cfg.rank, world_size=cfg.world_size, batch_size=cfg.job.batch_size,
                              seed=cfg.seed, device=device)
    record = {"rank": cfg.rank, "world_size": cfg.world_size, "job": job.name, "steps": cfg.job.steps,
              "batch_size": cfg.job.batch_size, "parameters": sum(p.numel() for p in model.parameters()),
              "evals": [], "step_log": [], "eval_seconds": 0.0}
    interrupt: KeyboardInterrupt | None = None
    t_loop = t_end = None  # the step loop's start and end (train_seconds)
    ps: Worker | None = None
    # Before the Worker: torch.optim's constructor imports torch._dynamo, and that import once the RPC
    # transport has joined its world leaves the shards unreachable ("server-0 is not serving").
    inner = make_inner_optimizer(cfg, model.parameters()) if cfg.local_updates else None
    try:
        # Early sends would beat injected compute and network delays, so faults turn the overlap off.
        ps = Worker(model, cfg.servers, rank=cfg.rank, world_size=cfg.world_size, transport=cfg.transport,
                    timeout=cfg.request_timeout, curve_keys=cfg.curve_keys, wire_dtype=cfg.wire_dtype,
                    overlap=cfg.overlap and not faults.active, clip_grad_norm=cfg.clip_grad_norm,
                    local_steps=cfg.local_steps if cfg.local_updates else None,
                    compress=cfg.compress, error_feedback=cfg.error_feedback,
                    momentum_correction=cfg.momentum_correction, momentum_masking=cfg.momentum_masking,
                    compress_warmup=cfg.compress_warmup, sign_scale=cfg.sign_scale,
                    compress_min_numel=cfg.compress_min_numel, shared_memory=cfg.shared_memory, bulk=cfg.bulk,
                    push_chunk_mb=cfg.push_chunk_mb)
        record["plan_hash"] = ps.plan.hash
        with ps:
            if cfg.rank == 0:
                record_eval(job, model, device, record, step=0)
            t_loop = time.time()
            for step in inner_steps(cfg, cfg.job.steps, ps):  # range(steps) but under local_steps auto
                t0 = time.perf_counter()
                batch = next(batches)
                loss = job.loss_of(model, batch)
                loss.backward()  # psrv.Worker sends each shard's gradient as soon as it is final
                if inner is not None:
                    inner.step()  # local steps: the inner step; ps.step() pushes every cfg.local_steps
                faults.compute(step, time.perf_counter() - t0)
                t1 = time.perf_counter()
                faults.before_send()
                info = ps.step()  # sends the shards not sent during backward, waits, pulls into the model
                t2 = time.perf_counter()
                row = {"wall_time": time.time(), "worker": cfg.rank, "step": step, "loss": loss.item(),
                       "staleness": info.staleness, "compute_seconds": t1 - t0,
                       "communication_seconds": max(0.0, t2 - t1 - info.waited),
                       "wait_seconds": min(info.waited, t2 - t1), "batch_size": batch_size_of(batch),
                       "pushed": info.pushed}  # on every row: with local steps, every H-th pushes
                record["step_log"].append(row)
                if metrics is not None:
                    metrics.observe_step(row)
                    if inner is not None and info.pushed:
                        metrics.observe_round(ps.pseudo_grad_norms[-1], ps.next_local_steps)
                if progress is not None:
                    progress(step + 1)
                if cfg.rank == 0 and cfg.job.eval_every and (step + 1) % cfg.job.eval_every == 0 and step + 1 < cfg.job.steps:
                    t_eval = time.perf_counter()  # off the clock: train_seconds leaves it out
                    record_eval(job, model, device, record, step=step + 1)
                    record["eval_seconds"] += time.perf_counter() - t_eval
            t_end = time.time()
            ps.close()  # rank 0: the weights after every worker's last push; then every worker leaves
        if cfg.rank == 0:
            record_final(job, model, device, record, step=cfg.job.steps)
    except KeyboardInterrupt as exc:  # in a zmq wait or anywhere in a step: psrv.Worker has left
        interrupt, t_end = exc, t_end or time.time()
        log.warning("worker %d: interrupted at step %d; leaving", cfg.rank, len(record["step_log"]))
    rows = record["step_log"]
    norms = ps.pseudo_grad_norms if ps is not None and inner is not None else []
    if inner is not None:
        record.update(local_steps=cfg.local_steps, inner_steps=len(rows), pseudo_grad_norms=norms,
                      inner_steps_per_push=ps.inner_steps_per_push if ps is not None else [])
    record.update(pushes=len(norms) if inner is not None else len(rows), samples=sum(r["batch_size"] for r in rows),
                  train_seconds=t_end - t_loop - record["eval_seconds"] if t_loop else 0.0,
                  early_sends=ps.early_sends if ps is not None else 0,
                  wall_seconds=time.time() - started,
                  max_staleness=max((r["staleness"] for r in rows), default=0),
                  max_rss_bytes=peak_rss_bytes(),
                  **(ps.compression() if ps is not None else {}), **(ps.wire_bytes() if ps is not None else {}),
                  final_params=parameters_to_vector(model.parameters()).detach().cpu(),
                  final_state=model.state_dict())  # parameters and this worker's buffers
    if interrupt is not None:
        record.update(interrupted=True, steps_done=len(rows))
        raise TrainingInterrupted(record, interrupt) from None
    return record
