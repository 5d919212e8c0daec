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
from psrv.client import Worker
from psrv.client.inner_step import inner_step
from psrv.client.step_timer import StepTimer
from psrv.client.steplog import StepLog
from psrv.workers.faults import FaultInjector
from psrv.workers.evals import record_eval, record_final, record_initial
from psrv.workers.jobs import batch_size_of, load_job
from psrv.workers.local_steps import inner_steps, make_inner_optimizer

_log = logging.getLogger("psrv.worker")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, where the entry point makes it one) stopped `train`. The worker has already
    sent LEAVE to every shard (best effort, bounded by 2 s). `record` is its record so far:
    `interrupted` True, `steps_done`, the rows of the steps done; `interrupt` is the
    KeyboardInterrupt that stopped it (psrv.process.Interrupted says which signal)."""

    def __init__(self, record: dict, interrupt: KeyboardInterrupt):
        super().__init__(f"worker {record['rank']}: interrupted at step {record['steps_done']}")
        self.record, self.interrupt = record, interrupt


def _totals(ps: Worker | None) -> dict:
    """psrv.Worker's totals for a record, or none where it never started or cannot say after an error."""
    try:
        return ps.totals() if ps is not None else {}
    except Exception:  # noqa: BLE001  (the record's rows still count the steps; the error is raised above)
        return {}


def train(cfg: WorkerConfig, *, log: StepLog | None = None, progress=None) -> dict:
    """Train until the run's step cfg.job.steps against the servers (from the step of the shards' clock where
    a restarted or late worker joins: psrv.Worker's `start_step`); return this worker's record (psrv/client/steplog.py
    RECORD), which `log` (default: one that writes nothing) has saved, with the final weights beside it:
    `final_params` (the flat vector) and `final_state` (model.state_dict()). `progress(step)` is called
    after each step. Raises TrainingInterrupted (a KeyboardInterrupt, after LEAVE) on Ctrl-C.

    With local steps (cfg.local_updates) a step is an inner step of this worker's own optimizer, one
    step-log row each (`pushed`: whether it pushed); every cfg.local_steps-th pushes the pseudo-gradient,
    and the record's `pushes` counts those pushes (the last, partial round's included).

    Rank 0's evaluations between steps (--eval-every) are off its clock: no row holds them and
    train_seconds leaves out their `eval_seconds`. In sync the other workers' next push still waits for
    them at the servers (their wait_seconds), as nothing stops the other workers meanwhile."""
    log = log if log is not None else StepLog()
    device = torch.device(cfg.device)
    job = load_job(cfg.job.name, seed=cfg.seed)
    model = job.model.to(device)
    faults = FaultInjector(cfg.faults, rank=cfg.rank, seed=cfg.seed)
    batches = job.batches_for(rank=cfg.rank, world_size=cfg.world_size, batch_size=cfg.job.batch_size,
                              seed=cfg.seed, device=device)
    log.describe(rank=cfg.rank, world_size=cfg.world_size, job=job.name, steps=cfg.job.steps,
                 batch_size=cfg.job.batch_size)
    interrupt: KeyboardInterrupt | None = None
    ps: Worker | None = None
    # Before the Worker: torch.optim's constructor imports torch._dynamo, and that import once the RPC
    # transport has joined its world leaves the shards unreachable ("server-0 is not serving").
    inner = make_inner_optimizer(cfg, model.parameters()) if cfg.local_updates else None
    # rank 0's initial weights (the job's, seeded), the run's step-0 evaluation should it join a run under way
    initial = parameters_to_vector(model.parameters()).detach().clone() if cfg.rank == 0 else None
    try:
        # Early sends would beat injected compute and network delays, so faults turn the overlap off.
        # A timeout's messages name the command line's flag for it, which is what this loop's user has.
        ps = Worker.from_settings(model, cfg, overlap=cfg.overlap and not faults.active,
                                  timeout_option="--request-timeout")
        log.describe(**ps.described())
        with ps:
            if cfg.rank == 0:
                record_initial(job, model, device, log, initial=None if ps.start_step == 0 else initial)
            initial = None
            log.loop_began()
            timer = StepTimer()  # psrv.Worker's step timing (psrv/client/step_timer.py), the emulated net delay in it
            for step in inner_steps(cfg, cfg.job.steps, ps):  # range(steps) but under local_steps auto
                batch = next(batches)
                loss = job.loss_of(model, batch)
                loss.backward()  # psrv.Worker sends each shard's gradient as soon as it is final
                if inner is not None:  # local steps: the inner step; ps.step() pushes every cfg.local_steps
                    inner_step(inner)  # a NaN gradient leaves the inner optimizer's state as it was
                faults.compute(step, timer.computing())
                timer.computed()
                faults.before_send()
                info = ps.step()  # sends the shards not sent during backward, waits, pulls into the model
                log.row(step=step, loss=loss, **timer.row(waited=info.waited), batch_size=batch_size_of(batch),
                        staleness=info.staleness, pushed=info.pushed,  # with local steps, every H-th pushes
                        answered=info.answered)  # fragments: an earlier push's staleness, into its row
                if inner is not None and info.pushed:
                    log.pushed_round(ps.pseudo_grad_norms[-1], ps.next_local_steps)
                if progress is not None:
                    progress(step + 1)
                if cfg.rank == 0 and cfg.job.eval_every and (step + 1) % cfg.job.eval_every == 0 and step + 1 < cfg.job.steps:
                    t_eval = time.perf_counter()  # off the clock: train_seconds and the next step's compute leave it out
                    record_eval(job, model, device, log, step=step + 1)
                    took = time.perf_counter() - t_eval
                    log.off_clock(took)
                    timer.off_clock(took)
            log.loop_ended()
            ps.close()  # rank 0: the weights after every worker's last push; then every worker leaves
        if cfg.rank == 0:
            record_final(job, model, device, log, step=cfg.job.steps)
    except KeyboardInterrupt as exc:  # in a zmq wait or anywhere in a step: psrv.Worker has left
        interrupt = exc
        log.loop_ended()
        _log.warning("worker %d: interrupted at step %d; leaving", cfg.rank, len(log.rows))
    except Exception as exc:  # a shard's refusal, a lost shard: the steps done are kept, then it goes on up
        log.save_failed(exc, **_totals(ps))
        raise
    totals = ps.totals() if ps is not None else {}
    record = log.record(interrupted=interrupt is not None, **totals)
    if interrupt is not None:  # the rows, not the partial weights
        log.save(record)
        raise TrainingInterrupted(record, interrupt) from None
    params, state = parameters_to_vector(model.parameters()).detach().cpu(), model.state_dict()
    log.save(record, params=params, state=state)
    return {**record, "final_params": params, "final_state": state}  # parameters and this worker's buffers
