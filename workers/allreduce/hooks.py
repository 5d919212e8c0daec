"""DDP communication hooks by name (--ddp-comm-hook), from torch.distributed.algorithms.ddp_comm_hooks,
each wrapped so that the step clock sees the end of compute: the hook point gradient compression fills.

none: allreduce_hook (the mean, DDP's default); fp16, bf16: the bucket cast to half precision for the
all-reduce and back (fp16_compress_hook, bf16_compress_hook); powersgd: PowerSGD (Vogels et al. 2019)
at --powersgd-rank, with error feedback and warm start, compressing from the 2nd step on (the
earliest torch allows with error feedback; before it, a plain all-reduce)."""
from __future__ import annotations

import functools

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (allreduce_hook, bf16_compress_hook,
                                                                       fp16_compress_hook)
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from psrv.workers.allreduce.clock import StepClock

POWERSGD_START = 2


def inner_hook(name: str, group, *, powersgd_rank: int = 1):
    """hook(bucket) -> Future: the named torch hook bound to its state (the group, or PowerSGD's)."""
    if name == "powersgd":
        state = PowerSGDState(process_group=group, matrix_approximation_rank=powersgd_rank,
                              start_powerSGD_iter=POWERSGD_START)
        return functools.partial(powerSGD_hook, state)
    hooks = {"none": allreduce_hook, "fp16": fp16_compress_hook, "bf16": bf16_compress_hook}
    if name not in hooks:
        raise ValueError(f"unknown DDP comm hook {name!r}; use none, fp16, bf16 or powersgd")
    return functools.partial(hooks[name], group)


class ClockedHook:
    """The state DDP hands the comm hook: the step clock and the torch hook it wraps."""

    def __init__(self, clock: StepClock, hook):
        self.clock, self.hook = clock, hook


def clocked_hook(state: ClockedHook, bucket):  # no annotation: DDP checks it against Future[Tensor]
    """When the step's last bucket is ready (backward is done): the clock's end of compute (faults,
    net delay, the wait barrier), then that bucket's collective, counted when it completes."""
    if bucket.is_last():
        state.clock.compute_done()
        return state.hook(bucket).then(state.clock.reduce_done)
    return state.hook(bucket)
