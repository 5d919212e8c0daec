"""The all-reduce ranks' shared loop: the PS modes' job, data shards, seeds, optimizer, schedule, clip and
evaluations under the wrapper the mode names (DDP, FSDP, ZeRO-1, or local steps over all-reduce).

`torchrun --nproc-per-node 2 -m psrv.workers.allreduce --mode fsdp --steps 20 --out run/worker-{rank}.json`, or
`psrv run --mode fsdp`."""
from __future__ import annotations

import datetime
import logging
import os
import time

import torch
import torch.distributed as dist

from psrv.config import ALLREDUCE_MODES, RunConfig
from psrv.workers.allreduce.clock import StepClock
from psrv.workers.evals import record_eval, record_final
from psrv.workers.faults import FaultInjector
from psrv.workers.jobs import batch_size_of, load_job
from psrv.workers.loop import TrainingInterrupted
from psrv.client.collective import BACKENDS, device_and_backend, init_group, split_wait
from psrv.client.steplog import StepLog

_log = logging.getLogger("psrv.ddp")

def _wrapper(cfg: RunConfig) -> type:
    if cfg.worker.local_updates:
        from psrv.workers.allreduce.local import LocalSteps
        return LocalSteps
    if cfg.mode == "fsdp":
        from psrv.workers.allreduce.fsdp import FSDP
        return FSDP
    if cfg.mode == "zero1":
        from psrv.workers.allreduce.zero import Zero1
        return Zero1
    from psrv.workers.allreduce.ddp import DDP
    return DDP


def _collectives(cfg: RunConfig) -> tuple[str, str | None]:
    """What the step beacon names a rank hanging in: the gradients' collective at the end of compute, and
    the one inside the optimizer's step (ZeRO-1's broadcast), if any."""
    if cfg.worker.local_updates:
        return "all_reduce of the pseudo-gradients (local steps)", None
    if cfg.mode == "fsdp":
        return "reduce_scatter of the gradients (FSDP)", None
    hook = cfg.allreduce.ddp_comm_hook
    gradients = f"all_reduce of the gradients (DDP{'' if hook == 'none' else f', comm hook {hook}'})"
    return gradients, "broadcast of the updated parameters (ZeRO-1)" if cfg.mode == "zero1" else None


def train_allreduce(cfg: RunConfig, *, log: StepLog | None = None, backend: str = "auto", timeout: float = 600.0,
                    progress=None) -> dict:
    """Train cfg.job.steps steps of cfg.mode (ddp, fsdp or zero1) as this rank; return its record
    (psrv/client/steplog.py RECORD), which `log` (default: one that writes nothing) has saved, with the
    final weights beside it as workers.loop.train returns them. `backend`: auto (nccl on cuda, gloo on cpu), gloo or nccl;
    `timeout`: seconds a collective may wait. Rendezvous is env:// as torchrun sets it (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Step rows and the wait: workers/allreduce/clock.py; no
    staleness column (every rank steps on the same reduced gradient). pushes counts the gradient collectives issued at
    the steps' ends, updates_applied the optimizer steps that ran (a post-hook).

    Evaluations are off the clock: at each one every rank stops (FSDP's ranks gather the weights), rank
    0 evaluates, and all meet at a barrier before the next step, so no row counts it; `eval_seconds` is
    the pauses between the first step and the last (--eval-every), which train_seconds leaves out.

    With local steps (cfg.worker.local_updates, mode ddp only) there is no wrapper: each rank steps its
    inner optimizer on the plain module and every H steps (and once more for a last, partial round)
    `OuterAllReduce` averages the pseudo-gradients and takes the outer step; a row is an inner step, and
    pushes and updates_applied count the outer rounds."""
    log = log if log is not None else StepLog()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if cfg.mode not in ALLREDUCE_MODES:
        raise ValueError(f"mode {cfg.mode!r} is not an all-reduce baseline ({', '.join(ALLREDUCE_MODES)})")
    device, backend = device_and_backend(cfg.cluster.device, backend, local_rank,
                                          int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    timeout = datetime.timedelta(seconds=timeout)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "MASTER_ADDR" in os.environ:
        init_group(backend, init_method="env://", timeout=timeout)
    elif world == 1:  # a lone rank outside torchrun needs no rendezvous
        init_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        raise ValueError("WORLD_SIZE > 1 needs MASTER_ADDR and MASTER_PORT: start the ranks with torchrun "
                         f"or `psrv run --mode {cfg.mode}`")
    try:
        # the evaluation pauses and the wait's exchange: a CPU group of their own, apart from the gradients'
        pauses = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
        return _train(cfg, rank=rank, world=world, device=device, group=dist.group.WORLD, pauses=pauses,
                      log=log, progress=progress, backend=backend)
    finally:
        dist.destroy_process_group()


def _train(cfg: RunConfig, *, rank: int, world: int, device, group, pauses, log: StepLog, progress,
           backend: str) -> dict:
    beacon = log.beacon  # what this rank is in, for the launcher's stall watch (psrv/step_beacon.py)
    beacon.off_clock("loading the job")
    job = load_job(cfg.job.name, seed=cfg.seed)  # every rank builds the same init; rank 0's is broadcast
    model = job.model.to(device)
    beacon.waiting(f"broadcast of rank 0's weights ({cfg.mode})")
    barrier = dist.new_group(backend="gloo") if cfg.allreduce.wait_barrier and world > 1 else None
    gradients, in_step = _collectives(cfg)
    clock = StepClock(FaultInjector(cfg.faults, rank=rank, seed=cfg.seed), barrier_group=barrier, beacon=beacon,
                      collective=gradients)
    run = _wrapper(cfg)(model, cfg, group, clock, device)
    outer = run.outer
    batches = job.batches_for(rank=rank, world_size=world, batch_size=cfg.job.batch_size, seed=cfg.seed,
                              device=device)
    log.describe(rank=rank, world_size=world, job=job.name, steps=cfg.job.steps, mode=cfg.mode,
                 batch_size=cfg.job.batch_size, backend=backend, ddp_comm_hook=cfg.allreduce.ddp_comm_hook,
                 parameters=sum(p.numel() for p in model.parameters()), device=str(device))

    def evaluate(step: int, *, final: bool = False) -> float:  # every rank calls it; rank 0 evaluates
        t = time.perf_counter()
        beacon.waiting("the evaluation's pause")  # FSDP's ranks gather the weights
        net = run.eval_model()
        if rank == 0:
            beacon.off_clock("evaluation")
            (record_final if final else record_eval)(job, net, device, log, step=step)
        beacon.waiting("barrier after rank 0's evaluation")
        dist.barrier(group=pauses)
        return time.perf_counter() - t

    _log.info("rank %d of %d: %s %s on %s, %s", rank, world, cfg.mode, job.name, device, backend)
    evaluate(0)
    log.loop_began()
    clock.timer.restart()  # the first step's compute begins here, after the step-0 evaluation
    interrupt: KeyboardInterrupt | None = None
    try:
        for step in range(cfg.job.steps):
            clock.start(step)
            batch = next(batches)
            run.optimizer.zero_grad(set_to_none=False)
            loss = job.loss_of(run.net, batch)
            loss.backward()  # the wrapper's hook reduces the gradients inside (after the clock's compute end)
            rounds = outer is not None and (step + 1) % cfg.worker.local_steps == 0
            if outer is None and cfg.optimizer.clip_grad_norm:  # the reduced gradient: the global batch's
                torch.nn.utils.clip_grad_norm_(run.net.parameters(), cfg.optimizer.clip_grad_norm)
            if in_step is not None:
                beacon.waiting(in_step)
            run.optimizer.step()
            if run.schedule is not None:
                run.schedule.step()
            if outer is not None:
                clock.compute_done(sync=rounds)
                if rounds:
                    outer()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            log.row(step=step, loss=loss, **clock.row(time.perf_counter()), batch_size=batch_size_of(batch))
            if progress is not None:
                progress(step + 1)
            if cfg.job.eval_every and (step + 1) % cfg.job.eval_every == 0 and step + 1 < cfg.job.steps:
                took = evaluate(step + 1)
                log.off_clock(took)
                clock.timer.off_clock(took)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where the entry point makes it one: keep the rows
        interrupt = exc
        _log.warning("rank %d: interrupted at step %d", rank, len(log.rows))
    except Exception as exc:  # a peer lost, a NaN in the reduced gradient: the steps done are kept, then it goes on up
        log.save_failed(exc, pushes=clock.reduced, updates_applied=clock.updates)
        raise
    if outer is not None and interrupt is None and cfg.job.steps % cfg.worker.local_steps:
        outer()  # the last, partial round, as psrv.Worker.close() pushes it
    log.loop_ended()  # the evaluations' pauses come off train_seconds
    if interrupt is None:  # after the last step every rank holds the same weights (FSDP's ranks gather them)
        evaluate(cfg.job.steps, final=True)
        if barrier is None and world > 1:  # the wait, from every rank's rows (clock.py)
            beacon.waiting("all_gather of the step times")
            split_wait(log.rows, pauses)
    beacon.off_clock("writing the record")
    local = {}
    if outer is not None:  # a push is an outer round's all-reduce
        clock.reduced = clock.updates = len(outer.norms)
        local = {"local_steps": cfg.worker.local_steps, "pseudo_grad_norms": outer.norms}
    record = log.record(interrupted=interrupt is not None, **local, pushes=clock.reduced,
                        updates_applied=clock.updates)
    if interrupt is not None:  # the rows, not the partial weights
        log.save(record)
        raise TrainingInterrupted(record, interrupt)
    final = run.eval_model()
    params = torch.cat([p.detach().reshape(-1) for p in final.parameters()]).cpu()
    log.save(record, params=params, state=final.state_dict())
    return {**record, "final_params": params, "final_state": final.state_dict()}  # parameters and buffers
