"""The DDP baseline worker: the PS modes' job, data shards, seeds and optimizer under DistributedDataParallel.

`torchrun --nproc-per-node 2 -m workers.ddp --steps 20 --out run/worker-{rank}.json`, or `psrv run --mode ddp`.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from psrv.config import OptimConfig, RunConfig
from psrv.config.cli_args import add_config_arguments, config_from_args, read_config_file
from psrv.schedule import is_scheduled, lr_factor
from workers.faults import FaultInjector
from workers.evals import record_eval, record_final
from workers.jobs import batch_size_of, load_job
from workers.local_steps import make_inner_optimizer
from workers.loop import TrainingInterrupted

log = logging.getLogger("psrv.ddp")

BACKENDS = ("auto", "gloo", "nccl")


def make_optimizer(cfg: OptimConfig, params) -> torch.optim.Optimizer:
    """The torch.optim optimizer psrv.server.optim.make_optimizer builds, over a model's parameters."""
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay)
    cls = torch.optim.Adam if cfg.name == "adam" else torch.optim.AdamW
    return cls(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


def make_schedule(cfg: OptimConfig, optimizer: torch.optim.Optimizer) -> LambdaLR | None:
    """torch's LambdaLR over psrv.schedule.lr_factor, stepped once per optimizer step: the lr the servers
    use at the same update count, bit for bit; None when cfg has no schedule."""
    return LambdaLR(optimizer, functools.partial(lr_factor, cfg)) if is_scheduled(cfg) else None


class OuterAllReduce:
    """Local SGD / DiLoCo over all-reduce: the outer step of every `local_steps` inner steps. The ranks
    all-reduce (mean) their pseudo-gradients w_shared - w_now and step cfg's optimizer (the servers' one)
    on a shared copy of the weights, which every rank then loads: the same update as sync PS."""

    def __init__(self, model: torch.nn.Module, cfg: OptimConfig, group):
        self.params, self.group = list(model.parameters()), group
        with torch.no_grad():
            for p in self.params:  # rank 0's start, as DDP's constructor broadcasts it
                dist.broadcast(p, 0, group=group)
        self.shared = [p.detach().clone() for p in self.params]
        self.optimizer = make_optimizer(cfg, self.shared)
        self.schedule = make_schedule(cfg, self.optimizer)
        self.clip = cfg.clip_grad_norm
        self.norms: list[float] = []  # this rank's pseudo-gradient norm at each round, before the mean

    def __call__(self) -> None:
        with torch.no_grad():
            delta = torch.cat([(s - p).reshape(-1) for s, p in zip(self.shared, self.params)])
            self.norms.append(float(delta.norm()))
            dist.all_reduce(delta, group=self.group)
            delta /= dist.get_world_size(self.group)
            offset = 0
            for s in self.shared:
                s.grad = delta[offset:offset + s.numel()].view_as(s)
                offset += s.numel()
        if self.clip:  # the averaged pseudo-gradient, as sync's server clips the averaged push
            torch.nn.utils.clip_grad_norm_(self.shared, self.clip)
        self.optimizer.step()
        if self.schedule is not None:
            self.schedule.step()
        with torch.no_grad():
            for p, s in zip(self.params, self.shared):
                p.copy_(s)


class _StepClock:
    """State of the DDP comm hook: it applies the step's emulated compute and network delay when the
    last gradient bucket is ready (backward is done), then starts the all-reduce of that bucket.
    It also counts what really happened: all-reduces of a step's last bucket that completed
    (`reduced`) and optimizer steps that ran (`updates`, from an optimizer step post-hook)."""

    def __init__(self, faults: FaultInjector, group):
        self.faults = faults
        self.group = group
        self.step = 0
        self.t0 = 0.0
        self.compute_end: float | None = None
        self.reduced = 0
        self.updates = 0

    def start(self, step: int) -> None:
        self.step, self.t0, self.compute_end = step, time.perf_counter(), None

    def reduce_done(self, fut):
        self.reduced += 1
        return fut.value()

    def stepped(self, optimizer, args, kwargs) -> None:
        self.updates += 1


def _timed_allreduce(clock: _StepClock, bucket):  # no annotation: DDP checks it against Future[Tensor]
    if bucket.is_last():
        clock.faults.compute(clock.step, time.perf_counter() - clock.t0)
        clock.compute_end = time.perf_counter()
        clock.faults.before_send()
        return allreduce_hook(clock.group, bucket).then(clock.reduce_done)
    return allreduce_hook(clock.group, bucket)


def _device_and_backend(name: str, backend: str, local_rank: int, local_world: int) -> tuple[torch.device, str]:
    if name == "cpu":
        return torch.device("cpu"), "gloo" if backend == "auto" else backend
    count = torch.cuda.device_count()
    if count == 0:
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA device")
    device = torch.device(f"cuda:{local_rank % count}" if name == "cuda" else name)
    if backend != "auto":
        return device, backend
    # nccl refuses two ranks on one GPU; gloo all-reduces CUDA tensors too.
    return device, "nccl" if name == "cuda" and local_world <= count else "gloo"


def train_ddp(cfg: RunConfig, *, backend: str = "auto", timeout: float = 600.0, progress=None) -> dict:
    """Train cfg.job.steps DDP steps as this rank; return its record (the same keys as workers.loop.train).
    `backend`: auto (nccl on cuda, gloo on cpu), gloo or nccl; `timeout`: seconds a collective may wait.

    Rendezvous is env:// as torchrun sets it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
    gloo on CPU, nccl on GPU. A comm hook wraps DDP's default all-reduce (mean of the gradients): when the
    last gradient bucket is ready it applies the emulated compute/straggler sleep, then the network delay,
    then starts the all-reduce, so the faults act where they act in the PS loop (before the "send").
    Step rows: compute_seconds = forward + backward until the last bucket is ready + emulated compute;
    communication_seconds = the rest: net delay, the all-reduce still in flight (including waiting for a
    slower rank, which gloo/nccl cannot tell apart from transfer) and the optimizer step (the PS analogue
    is the server applying the update inside push_pull); wait_seconds = 0; no staleness column (DDP has none
    to measure: every rank steps on the same all-reduced gradient). pushes and updates_applied are counted
    by the comm hook (all-reduces completed) and an optimizer step post-hook (steps that ran).

    With local steps (cfg.worker.local_updates: --local-steps H, --inner-optimizer) there is no DDP
    wrapper: each rank steps its inner optimizer on the plain module, and every H steps (and once more
    for a last, partial round) `OuterAllReduce` averages the pseudo-gradients and takes the outer step;
    a row is an inner step, and pushes and updates_applied count the outer rounds.
    """
    started = time.time()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    device, backend = _device_and_backend(cfg.cluster.device, backend, local_rank,
                                          int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    timeout = datetime.timedelta(seconds=timeout)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    elif world == 1:  # a lone rank outside torchrun needs no rendezvous
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        raise ValueError("WORLD_SIZE > 1 needs MASTER_ADDR and MASTER_PORT: start the ranks with torchrun "
                         "or `psrv run --mode ddp`")
    try:
        return _train(cfg, rank=rank, world=world, device=device, group=dist.group.WORLD,
                      started=started, progress=progress, backend=backend)
    finally:
        dist.destroy_process_group()


def _train(cfg: RunConfig, *, rank: int, world: int, device, group, started: float, progress,
           backend: str) -> dict:
    job = load_job(cfg.job.name, seed=cfg.seed)  # every rank builds the same init; DDP broadcasts rank 0's
    model = job.model.to(device)
    clock = _StepClock(FaultInjector(cfg.faults, rank=rank, seed=cfg.seed), group)
    local, outer = cfg.worker.local_updates, None
    if local:  # local SGD / DiLoCo: inner steps on the plain module, an outer all-reduce every local_steps
        net, outer = model, OuterAllReduce(model, cfg.optimizer, group)
        optimizer, schedule = make_inner_optimizer(cfg.worker, model.parameters()), None
    else:
        net = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                      process_group=group)
        net.register_comm_hook(clock, _timed_allreduce)
        optimizer = make_optimizer(cfg.optimizer, net.parameters())
        optimizer.register_step_post_hook(clock.stepped)
        schedule = make_schedule(cfg.optimizer, optimizer)
    batches = job.batches_for(rank=rank, world_size=world, batch_size=cfg.job.batch_size, seed=cfg.seed,
                              device=device)
    record = {"rank": rank, "world_size": world, "job": job.name, "steps": cfg.job.steps,
              "batch_size": cfg.job.batch_size, "backend": backend,
              "parameters": sum(p.numel() for p in model.parameters()), "evals": [], "step_log": []}
    log.info("rank %d of %d: %s on %s, %s", rank, world, job.name, device, backend)
    if rank == 0:
        record_eval(job, model, device, record, step=0)
    t_loop = time.time()
    interrupt: KeyboardInterrupt | None = None
    try:
        for step in range(cfg.job.steps):
            clock.start(step)
            batch = next(batches)
            optimizer.zero_grad(set_to_none=False)
            loss = job.loss_of(net, batch)
            loss.backward()  # the comm hook all-reduces (averages) the gradient buckets inside
            if outer is not None:
                clock.faults.compute(step, time.perf_counter() - clock.t0)
                clock.compute_end = time.perf_counter()
            elif cfg.optimizer.clip_grad_norm:  # the all-reduced gradient: the global batch's, as sync's server
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.clip_grad_norm)
            optimizer.step()
            if schedule is not None:
                schedule.step()
            if outer is not None and (step + 1) % cfg.worker.local_steps == 0:
                clock.faults.before_send()
                outer()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t_end = time.perf_counter()
            compute_end = clock.compute_end if clock.compute_end is not None else t_end
            row = {"wall_time": time.time(), "worker": rank, "step": step, "loss": loss.item(),
                   "compute_seconds": compute_end - clock.t0, "communication_seconds": t_end - compute_end,
                   "wait_seconds": 0.0, "batch_size": batch_size_of(batch)}
            record["step_log"].append(row)
            if progress is not None:
                progress(step + 1)
            if rank == 0 and cfg.job.eval_every and (step + 1) % cfg.job.eval_every == 0 and step + 1 < cfg.job.steps:
                record_eval(job, model, device, record, step=step + 1)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where the entry point makes it one: keep the rows
        interrupt = exc
        log.warning("rank %d: interrupted at step %d", rank, len(record["step_log"]))
    if outer is not None and interrupt is None and cfg.job.steps % cfg.worker.local_steps:
        outer()  # the last, partial round, as psrv.Worker.close() pushes it
    train_seconds = time.time() - t_loop
    if interrupt is not None:
        record.update(interrupted=True, steps_done=len(record["step_log"]))
    elif rank == 0:  # after the last all-reduce every rank holds the same weights
        record_final(job, model, device, record, step=cfg.job.steps)
    rows = record["step_log"]
    # Counted, not assumed: pushes = this rank's gradients that came back all-reduced, updates_applied =
    # optimizer steps that ran. No staleness: every rank steps on the same all-reduced gradient.
    if outer is not None:  # a push is an outer round's all-reduce
        clock.reduced = clock.updates = len(outer.norms)
        record.update(local_steps=cfg.worker.local_steps, inner_steps=len(rows), pseudo_grad_norms=outer.norms)
    record.update(pushes=clock.reduced, updates_applied=clock.updates, samples=sum(r["batch_size"] for r in rows),
                  train_seconds=train_seconds, wall_seconds=time.time() - started,
                  final_params=torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu(),
                  final_state=model.state_dict())  # parameters and this rank's buffers
    if interrupt is not None:
        raise TrainingInterrupted(record, interrupt)
    return record


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workers.ddp", description="One DDP rank of the baseline: "
                                "start it with torchrun (or let `psrv run --mode ddp` start it). Example: "
                                "torchrun --nproc-per-node 2 -m workers.ddp --steps 100 --out run/worker-{rank}.json")
    p.add_argument("--config", type=Path, metavar="FILE", help="the run's config (a run directory's "
                   "config.json); the options given override it")
    add_config_arguments(p, RunConfig)
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: nccl on cuda, gloo on cpu")
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds (default: %(default)s)")
    p.add_argument("--out", help="write this rank's record (JSON) here; '{rank}' in the path is replaced by "
                   "the rank, else ranks > 0 write NAME-rankR.json beside it")
    p.add_argument("--params-out", type=Path, help="rank 0 saves the final flat parameter vector here")
    p.add_argument("--state-out", type=Path, help="rank 0 saves the final model.state_dict() here (parameters "
                   "and buffers)")
    p.add_argument("--progress-file", help="keep the number of finished steps here ('{rank}' as for --out)")
    p.add_argument("--log-level", default="INFO", help="logging level (default: %(default)s)")
    return p


def rank_path(template: str, rank: int) -> Path:
    """--out for this rank: '{rank}' filled in, else NAME-rankR.SUFFIX for ranks > 0."""
    if "{rank}" in template:
        return Path(template.replace("{rank}", str(rank)))
    path = Path(template)
    return path if rank == 0 else path.with_name(f"{path.stem}-rank{rank}{path.suffix}")


def main(argv: list[str] | None = None) -> int:
    from psrv.process import exit_code, interrupt_on_signals
    a = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    interrupt_on_signals()  # a rank is an entry point of its own: SIGTERM takes Ctrl-C's path, rows kept
    logging.basicConfig(level=getattr(logging, str(a.log_level).upper(), logging.INFO),
                        format=f"%(asctime)s ddp-worker {rank} %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(RunConfig, a, base=read_config_file(a.config) if a.config else {},
                               extra={"mode": "ddp"})
        progress = None
        if a.progress_file:
            path = rank_path(a.progress_file, rank)
            progress = lambda step: (step % 10 == 0 or step == cfg.job.steps) and path.write_text(str(step))  # noqa: E731
        record = train_ddp(cfg, backend=a.backend, timeout=a.timeout, progress=progress)
    except TrainingInterrupted as exc:  # said in one line; keep the rows, not the partial weights
        record = exc.record
        for key in ("final_params", "final_state"):
            record.pop(key)
        _write_record(a.out, rank, record)
        return exit_code(exc.interrupt)
    except ValueError as exc:
        print(f"workers.ddp: error: {exc}", file=sys.stderr)
        return 2
    params, state = record.pop("final_params"), record.pop("final_state")
    if a.params_out and rank == 0:
        a.params_out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(params, a.params_out)
    if a.state_out and rank == 0:
        a.state_out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu().clone() for k, v in state.items()}, a.state_out)
    _write_record(a.out, rank, record)
    return 0


def _write_record(template: str | None, rank: int, record: dict) -> None:
    if template:
        path = rank_path(template, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)


if __name__ == "__main__":
    code = main()
    # Every output is written and closed by now. Leave without running C++ destructors: gloo's
    # threads, torn down at interpreter exit, sometimes abort a rank that has finished cleanly
    # ("terminate called without an active exception"), turning a good run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
