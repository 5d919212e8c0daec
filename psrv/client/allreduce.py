"""psrv.AllReduceWorker, what psrv.make_worker gives under an all-reduce run (`psrv run --mode ddp|zero1
--script train.py`): the same loop as psrv.Worker's, its gradient all-reduced among the ranks instead of pushed
to shards, and the run's optimizer stepped on every rank, so one script compares the parameter server with DDP.

    ps = psrv.make_worker(model) # PSRV_MODE ddp or zero1, PSRV_CONFIG the run's config.json
    for x, y in loader:
        loss_fn(model(x), y).backward()
        ps.step()                # all-reduce the mean gradient, clip, step the optimizer and schedule
    ps.close()                   # the step log's record (rank 0: the final weights); the group torn down

psrv.make_worker(...) is an AllReduceWorker where PSRV_MODE names an all-reduce mode (psrv/client/make.py
chooses; psrv.Worker itself is refused there). What it computes is DDP's: every rank starts from rank 0's
parameters and buffers (as DDP's constructor broadcasts them), and each step() averages the gradients over the
ranks, clips the mean by the run's global norm (psrv.clip, as sync's servers clip each clock's mean) and steps
the run's optimizer and lr schedule locally (psrv/client/torch_optim.py: what the servers and the shipped
all-reduce ranks step). zero1 steps torch's ZeroRedundancyOptimizer instead, which keeps and steps each rank's
share of the optimizer state and broadcasts the updated parameters. fsdp is refused: fully_shard turns the
model's parameters into sharded DTensors behind the script's back, which a loop written for psrv.Worker does not
expect.
"""
from __future__ import annotations

import datetime
import inspect
import logging
import os
import time

import torch
import torch.distributed as dist

from psrv.clip import clip_flat_
from psrv.config import RunConfig
from psrv.config.base import defaults_of
from psrv.config.sections import WorkerSettings
from psrv.step_beacon import StepBeacon
from psrv.client.collective import device_and_backend, init_group, split_wait
from psrv.client.flat import FlatModel
from psrv.client.keywords import allreduce_mode, env
from psrv.client.recorded import RecordedWorker
from psrv.client.run_settings import run_config_from_env
from psrv.client.script_evals import Evaluations
from psrv.client.step_info import StepInfo
from psrv.client.settings import call_keywords, keyword_default
from psrv.client.step_timer import StepTimer
from psrv.client.steplog import StepLog, check_step_args
from psrv.client.torch_optim import make_schedule, optimizer_class, torch_optimizer

log = logging.getLogger("psrv.worker")

_REQUEST_TIMEOUT = defaults_of(WorkerSettings).request_timeout  # psrv.Worker's `timeout`, here each collective's
SCRIPT_MODES = ("ddp", "zero1")  # the all-reduce modes a psrv.Worker loop runs under
_KEPT = ("rank", "world_size", "timeout", "clip_grad_norm", "step_log", "evaluate", "eval_every")  # psrv.Worker's keywords that apply here
# what the step beacon (psrv/step_beacon.py) says this rank is in: the launcher names it if the rank hangs
_SCRIPT = "the script's own code between steps"
_GRADIENTS = "all_reduce of gradients (AllReduceWorker.step)"  # 47 bytes at most (psrv/step_beacon.py)
_ZERO_BROADCAST = "broadcast of the updated parameters (ZeroRedundancyOptimizer)"
_FSDP = ("mode 'fsdp' does not run a psrv.Worker loop: fully_shard would turn the model's parameters into "
         "sharded DTensors behind the script's back; use --mode ddp or zero1")


class AllReduceWorker(RecordedWorker):
    """One rank of an all-reduce run driving `model` (float32 parameters on one device) with `config`'s
    mode (ddp or zero1), optimizer, lr schedule and clip.

    `rank` and `world_size` default to the environment's RANK and WORLD_SIZE. torch.distributed is set up
    from the env:// variables (MASTER_ADDR and MASTER_PORT; LOCAL_RANK and LOCAL_WORLD_SIZE choose nccl
    or gloo for a CUDA model, gloo on CPU) with `timeout` seconds for each collective, unless the script
    set it up itself; close() tears down only a group it made.

    The model's parameters become views of one flat buffer and their `.grad` views of another, as under
    the parameter server; `step()` zeroes the gradients. A parameter that gets no gradient is stepped on
    a zero one, as its shard would. Buffers (BatchNorm statistics) start as rank 0's and then stay with
    each rank. `clip_grad_norm`, if given, must be the run's (the clip is the run's setting).

    Every rank must call step() as often and close() once (the collectives pair them up). Use it as a
    context manager, or call close(); an error or Ctrl-C inside step() or the `with` block writes what
    ran, marked interrupted, and tears the group down, so the other ranks stop too."""

    def __init__(self, model: torch.nn.Module, *, config: RunConfig, rank: int | None = None,
                 world_size: int | None = None, timeout: float = _REQUEST_TIMEOUT, clip_grad_norm: float | None = 0.0,
                 step_log: StepLog | None = None, evaluate=None, eval_every: int = 0):
        if config.mode == "fsdp":
            raise ValueError(_FSDP)
        if config.mode not in SCRIPT_MODES:
            raise ValueError(f"mode {config.mode!r} is not an all-reduce mode ({', '.join(SCRIPT_MODES)})")
        run_clip = float(config.optimizer.clip_grad_norm or 0.0)
        if clip_grad_norm and float(clip_grad_norm) != run_clip:
            raise ValueError(f"clip_grad_norm={clip_grad_norm:g}, but the run clips by {run_clip:g} "
                             "(--clip-grad-norm); give the run's value or none")
        self.mode, self.clip_grad_norm, self.model = config.mode, run_clip, model
        self.rank = int(rank if rank is not None else env("RANK"))
        self.world_size = int(world_size if world_size is not None else env("WORLD_SIZE"))
        self._evals = Evaluations(None, rank=self.rank, evaluate=evaluate, eval_every=eval_every)  # checked first
        self._flat = FlatModel(model)
        self._made_group = not dist.is_initialized()
        if self._made_group:
            self.backend = _backend_for(self._flat.params.device)
            _init_group(self.backend, self.rank, self.world_size, timeout)
        else:
            self.backend = str(dist.get_backend())
            if (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world_size):
                raise ValueError(f"rank {self.rank} of {self.world_size}, but the script's process group has "
                                 f"this process as rank {dist.get_rank()} of {dist.get_world_size()}")
        self._open = True
        try:
            dist.broadcast(self._flat.params, src=0)  # every rank starts from rank 0's, as DDP's constructor
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)
            self.optimizer = _optimizer(config, model)
            self.schedule = make_schedule(config.optimizer, self.optimizer)
        except BaseException:
            self._open = False
            self._teardown()
            raise
        self.steps = self.start_step = self.start_clock = 0  # as psrv.Worker's: every rank is there from the start
        self.updates_applied = 0  # optimizer steps that ran
        self._log = step_log if step_log is not None else StepLog.from_env(rank=self.rank)
        self._beacon = self._log.beacon if self._log is not None else StepBeacon(None)
        if self._log is not None:
            self._log.describe(**self.described())
        self._evals.log = self._log
        self._evaluate(0)  # rank 0's first weights, before any step (psrv/client/script_evals.py)
        self._beacon.working(_SCRIPT)
        self._timer = StepTimer()  # a logged step's compute: from here to its step() call

    @classmethod
    def from_worker_call(cls, signature: inspect.Signature, *args, **keywords) -> "AllReduceWorker":
        """psrv.make_worker(*args, **keywords), psrv.Worker's constructor having `signature`, under the all-reduce run
        the environment names: the run's config from PSRV_CONFIG; ValueError, naming the keyword, for a
        parameter-server option given a value of its own (servers, local_steps, compress, ...)."""
        given = call_keywords(signature, args, keywords)  # a TypeError as psrv.Worker's own would be
        model = given.pop("model")
        config = run_config_from_env()
        if config is None:
            raise ValueError(f"psrv.make_worker under PSRV_MODE={allreduce_mode()}: set PSRV_CONFIG to the run's "
                             "config.json (its optimizer, lr schedule and clip), as `psrv run --script` does")
        for name, value in given.items():
            if name not in _KEPT and value != keyword_default(signature, name):
                raise ValueError(f"psrv.make_worker({name}=...): a parameter-server option, and mode {config.mode!r} "
                                 "all-reduces the gradients among the ranks, with no shards; remove it")
        return cls(model, config=config, **{k: v for k, v in given.items() if k in _KEPT})

    def step(self, *, loss: float | torch.Tensor | None = None, batch_size: int | None = None) -> StepInfo:
        """All-reduce the gradient backward left in the model (the mean over the ranks), clip it by the
        run's norm, step the optimizer and the lr schedule, and zero the gradients. `loss` and
        `batch_size`, if given, go into the step log, as psrv.Worker's. The StepInfo's clock counts the
        steps done, its version the optimizer steps; staleness and waited are 0 (every rank steps on
        the same gradient; the wait for the slowest rank is split out at close())."""
        t0 = time.perf_counter()
        check_step_args(loss, batch_size)
        self._check_open()
        try:
            grads = self._flat.grads
            self._beacon.waiting(_GRADIENTS)
            dist.all_reduce(grads)
            grads.div_(self.world_size)
            if self.clip_grad_norm:
                clip_flat_(grads, self.clip_grad_norm)
            if self.mode == "zero1":
                self._beacon.waiting(_ZERO_BROADCAST)
            self.optimizer.step()
            if self.schedule is not None:
                self.schedule.step()
            self._flat.zero_grad()
            if grads.device.type == "cuda":
                torch.cuda.synchronize(grads.device)
        except BaseException:
            self._abandon()
            raise
        self.updates_applied += 1
        info = StepInfo(step=self.steps, clock=self.steps + 1, version=self.updates_applied, staleness=0,
                        waited=0.0, seconds=time.perf_counter() - t0)
        self.steps += 1
        self._timer.computed(t0)
        seconds = self._timer.row(end=t0 + info.seconds)  # the wait: split off after the run (close())
        if self._log is not None:
            self._log.row(step=info.step, loss=loss, **seconds, batch_size=batch_size)
        if self._evals.due(self.steps):
            self._evaluate(self.steps)
        self._beacon.working(_SCRIPT)
        self._timer.restart()  # an evaluation above is no step's compute
        return info

    def close(self) -> None:
        """End this rank: the ranks split the wait for the slowest out of each step's time (a collective,
        where every rank kept the same steps), the step log's record is written (rank 0's with the final
        weights), and a process group this worker made is torn down."""
        if not self._open:
            return
        try:
            self._beacon.waiting("all_gather of the step times (close)")
            self._split_wait()
        except BaseException:  # a rank gone: what ran is written, marked interrupted
            self._abandon()
            raise
        self._open = False
        try:
            self._evaluate(self.steps, between_steps=False)  # rank 0, on the final weights
            self._beacon.off_clock("writing the record")
            self._save()
        finally:
            self._teardown()
            self._beacon.off_clock("after close(): the script's own code")  # no more steps to wait for

    def described(self) -> dict:
        """What a worker record says of this rank before it trains (psrv/client/steplog.py RECORD)."""
        return {"rank": self.rank, "world_size": self.world_size, "mode": self.mode, "backend": self.backend,
                "ddp_comm_hook": "none", "parameters": self._flat.params.numel(),
                "device": str(self._flat.params.device)}

    def totals(self) -> dict:
        """What a worker record counts at the end: the gradient collectives and the optimizer steps."""
        return {"pushes": self.steps, "updates_applied": self.updates_applied}

    # --- mechanics ----------------------------------------------------------
    def _evaluate(self, step: int, *, between_steps: bool = True) -> None:
        """evaluate= on rank 0 (psrv/client/script_evals.py), off the clock for the launcher's stall watch."""
        if self._evals.evaluate is not None and self.rank == 0:
            self._beacon.off_clock("evaluation (evaluate=)")
        self._evals.run(step, between_steps=between_steps)

    def _split_wait(self) -> None:
        """Each step's wait for the slowest rank, where every rank logged the same number of steps."""
        if self.world_size == 1:
            return
        rows = self._log.rows if self._log is not None else None
        mine = torch.tensor([-1 if rows is None else len(rows)], dtype=torch.int64)
        counts = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(counts, mine)
        if rows and len({int(c) for c in counts}) == 1:
            split_wait(rows, dist.group.WORLD)

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError(f"rank {self.rank}: this psrv.AllReduceWorker has ended (close() or an error)")

    def _abandon(self) -> None:
        """An error or Ctrl-C: write what ran, marked interrupted, no weights; tear the group down."""
        if not self._open:
            return
        self._open = False
        log.info("rank %d: stopped at step %d", self.rank, self.steps)
        try:
            if self._log is not None:
                self._log.save(self._log.record(interrupted=True, **self.totals()))
        finally:
            self._teardown()

    def _teardown(self) -> None:
        # The optimizer and its schedule go first: zero1's ZeroRedundancyOptimizer holds the group, which
        # would outlive destroy_process_group into the interpreter's exit (collective.init_group says
        # what that costs; a 2-rank ZeroRedundancyOptimizer kept to the exit aborted 8 of 30 runs).
        self.optimizer = self.schedule = None
        if self._made_group and dist.is_initialized():
            dist.destroy_process_group()


def _backend_for(device: torch.device) -> str:
    """gloo for a CPU model; for a CUDA one nccl where each local rank has a GPU of its own, else gloo."""
    rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", 0)))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    return device_and_backend("cpu" if device.type == "cpu" else "cuda", "auto", rank, local_world)[1]


def _init_group(backend: str, rank: int, world_size: int, timeout: float) -> None:
    """The default process group from the env:// variables; a lone rank needs none of them."""
    wait = datetime.timedelta(seconds=timeout)
    if os.environ.get("MASTER_ADDR", "").strip():
        init_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=wait)
    elif world_size == 1:
        init_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=wait)
    else:
        raise ValueError("psrv.AllReduceWorker: WORLD_SIZE > 1 under an all-reduce mode needs MASTER_ADDR and "
                         "MASTER_PORT (psrv run --script and torchrun set them)")


def _optimizer(config: RunConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The run's optimizer over the model's parameters; zero1: sharded by ZeroRedundancyOptimizer."""
    if config.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        cls, kwargs = optimizer_class(config.optimizer)
        return ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=cls, **kwargs)
    return torch_optimizer(config.optimizer, model.parameters())
