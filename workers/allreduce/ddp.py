"""DDP: DistributedDataParallel with the named comm hook, and the servers' optimizer on every rank."""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from psrv.config import RunConfig
from psrv.workers.allreduce.clock import StepClock
from psrv.workers.allreduce.hooks import ClockedHook, clocked_hook, inner_hook
from psrv.client.torch_optim import make_schedule, torch_optimizer


def wrap_ddp(model: torch.nn.Module, cfg: RunConfig, group, clock: StepClock, device) -> DistributedDataParallel:
    """`model` under DDP (its constructor broadcasts rank 0's weights), the comm hook registered.

    PowerSGD gets one bucket: its hook issues each bucket's collectives from future callbacks, and with
    several buckets (a 34 MB model in 25 MB buckets) gloo ranks issued them in different orders and the
    run aborted ("collective mismatch") in 3 of 4 tries; with one bucket, 5 of 5 ran. It costs the
    overlap of the all-reduce with backward."""
    one_bucket = {"bucket_cap_mb": 1e6} if cfg.allreduce.ddp_comm_hook == "powersgd" else {}
    net = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                  process_group=group, **one_bucket)
    hook = inner_hook(cfg.allreduce.ddp_comm_hook, group, powersgd_rank=cfg.allreduce.powersgd_rank)
    net.register_comm_hook(ClockedHook(clock, hook), clocked_hook)
    return net


class DDP:
    """The wrapped module (`net`), the optimizer and schedule; every rank holds the whole model."""

    outer = None

    def __init__(self, model: torch.nn.Module, cfg: RunConfig, group, clock: StepClock, device):
        self.model = model
        self.net = wrap_ddp(model, cfg, group, clock, device)
        self.optimizer = torch_optimizer(cfg.optimizer, self.net.parameters())
        self.optimizer.register_step_post_hook(clock.stepped)
        self.schedule = make_schedule(cfg.optimizer, self.optimizer)

    def eval_model(self) -> torch.nn.Module:
        """The model every rank holds (the same weights after each all-reduced step)."""
        return self.model
