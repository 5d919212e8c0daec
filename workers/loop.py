"""The worker loop: pull -> forward/backward -> push, over PSClient. One call: `train(cfg)`.

Ctrl-C (KeyboardInterrupt) anywhere between HELLO and the end sends LEAVE to every shard, so the
other workers' barriers go on without this one, and raises `TrainingInterrupted` with the record so far."""
from __future__ import annotations

import logging
import time

import torch

from psrv.client import PSClient
from psrv.config import WorkerConfig
from psrv.rss import peak_rss_bytes
from psrv.partition import PartitionPlan
from workers.data import batch_indices
from workers.faults import FaultInjector
from workers.flat import FlatModel
from workers.jobs import evaluate, load_job
from workers.overlap import ShardReadiness

log = logging.getLogger("psrv.worker")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, where the entry point makes it one) stopped `train`. The worker has already
    sent LEAVE to every shard (best effort, bounded by the client's LEAVE timeout). `record` is its
    record so far: `interrupted` True, `steps_done`, the rows of the steps done; `interrupt` is the
    KeyboardInterrupt that stopped it (psrv.process.Interrupted says which signal)."""

    def __init__(self, record: dict, interrupt: KeyboardInterrupt):
        super().__init__(f"worker {record['rank']}: interrupted at step {record['steps_done']}")
        self.record, self.interrupt = record, interrupt


def train(cfg: WorkerConfig, *, metrics=None, progress=None) -> dict:
    """Train cfg.job.steps steps against the servers; return this worker's record (see `psrv worker --out`).
    Raises TrainingInterrupted (a KeyboardInterrupt, after LEAVE) on Ctrl-C."""
    started = time.time()
    device = torch.device(cfg.device)
    job = load_job(cfg.job.name, seed=cfg.seed)
    model = job.model.to(device)
    flat = FlatModel(model)
    plan = PartitionPlan.from_module(model, len(cfg.servers))
    faults = FaultInjector(cfg.faults, rank=cfg.rank, seed=cfg.seed)
    # Early sends would beat injected compute and network delays, so faults turn the overlap off.
    readiness = ShardReadiness(model, plan.ranges) if cfg.overlap and plan.num_shards > 1 and not faults.active else None
    x_train, y_train = (t.to(device) for t in job.train)
    batches = batch_indices(len(x_train), rank=cfg.rank, world_size=cfg.world_size,
                            batch_size=cfg.job.batch_size, seed=cfg.seed)
    record = {"rank": cfg.rank, "world_size": cfg.world_size, "job": job.name, "steps": cfg.job.steps,
              "batch_size": cfg.job.batch_size, "parameters": plan.total, "plan_hash": plan.hash,
              "evals": [], "step_log": []}
    interrupt: KeyboardInterrupt | None = None
    t_loop = t_end = None  # the step loop's start and end (train_seconds)
    early_sends = 0  # shard pushes sent while backward was still running
    with PSClient(cfg.servers, plan, worker=cfg.rank, world_size=cfg.world_size,
                  transport=cfg.transport, timeout=cfg.request_timeout, curve_keys=cfg.curve_keys,
                  wire_dtype=cfg.wire_dtype) as client:
        try:
            welcome = client.hello()
            if cfg.rank == 0:
                client.init(flat.params.cpu())
            reply = client.first_pull(welcome, out=flat.params)  # waits, bounded, for rank 0's INIT
            clock = reply.clock
            if cfg.rank == 0:
                _eval(job, model, device, record, step=0, started=started)
                record["initial_loss"] = record["evals"][0]["eval_loss"]
            t_loop = time.time()
            for step in range(cfg.job.steps):
                t0 = time.perf_counter()
                idx = next(batches).to(device)
                flat.zero_grad()
                pushing = client.begin_push_pull(flat.grads, clock=clock, out=flat.params)
                if readiness is not None:
                    readiness.arm(pushing.ready)
                loss = job.loss_fn(model(x_train[idx]), y_train[idx])
                loss.backward()
                if readiness is not None:
                    readiness.disarm()
                faults.compute(step, time.perf_counter() - t0)
                t1 = time.perf_counter()
                faults.before_send()
                early_sends += pushing.early
                reply = pushing.finish()  # sends the shards not sent during backward, then waits for all
                t2 = time.perf_counter()
                clock = reply.clock
                row = {"wall_time": time.time(), "worker": cfg.rank, "step": step, "loss": loss.item(),
                       "staleness": reply.staleness, "compute_seconds": t1 - t0,
                       "communication_seconds": max(0.0, t2 - t1 - reply.waited),
                       "wait_seconds": min(reply.waited, t2 - t1), "batch_size": cfg.job.batch_size}
                record["step_log"].append(row)
                if metrics is not None:
                    metrics.observe_step(row)
                if progress is not None:
                    progress(step + 1)
                if cfg.rank == 0 and cfg.job.eval_every and (step + 1) % cfg.job.eval_every == 0 and step + 1 < cfg.job.steps:
                    _eval(job, model, device, record, step=step + 1, started=started)
            t_end = time.time()
            if cfg.rank == 0:
                # The final answer is the weights after every worker's last push: wait for the others to leave.
                client.pull(clock=clock, out=flat.params, final=True)
                _eval(job, model, device, record, step=cfg.job.steps, started=started)
                record["final_loss"] = record["evals"][-1]["eval_loss"]
                record["eval_accuracy"] = record["evals"][-1]["eval_accuracy"]
        except KeyboardInterrupt as exc:  # in a zmq wait or anywhere in a step: leave, keep the rows
            interrupt, t_end = exc, t_end or time.time()
            if readiness is not None:
                readiness.disarm()
            log.warning("worker %d: interrupted at step %d; leaving", cfg.rank, len(record["step_log"]))
        client.leave(timeout=2.0 if interrupt is not None else 5.0)  # an interrupted worker exits promptly
    rows = record["step_log"]
    record.update(pushes=len(rows), samples=len(rows) * cfg.job.batch_size,
                  train_seconds=t_end - t_loop if t_loop else 0.0, early_sends=early_sends,
                  wall_seconds=time.time() - started,
                  max_staleness=max((r["staleness"] for r in rows), default=0),
                  max_rss_bytes=peak_rss_bytes(),
                  final_params=flat.params.detach().cpu())
    if interrupt is not None:
        record.update(interrupted=True, steps_done=len(rows))
        raise TrainingInterrupted(record, interrupt) from None
    return record


def _eval(job, model, device, record: dict, *, step: int, started: float) -> None:
    loss, acc = evaluate(job, model, device=device)
    record["evals"].append({"wall_time": time.time(), "step": step, "eval_loss": loss, "eval_accuracy": acc})
    log.info("eval at step %d: loss %.4f accuracy %.4f", step, loss, acc)
