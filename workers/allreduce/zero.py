"""ZeRO-1: DDP (with its comm hook) for the gradients, and torch's ZeroRedundancyOptimizer, which keeps
each rank's share of the optimizer state, steps that share and broadcasts the updated parameters."""
from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from psrv.config import RunConfig
from psrv.workers.allreduce.clock import StepClock
from psrv.workers.allreduce.ddp import wrap_ddp
from psrv.client.torch_optim import make_schedule, optimizer_class


class Zero1:
    """The DDP-wrapped module (`net`), the sharded optimizer and the schedule."""

    outer = None

    def __init__(self, model: torch.nn.Module, cfg: RunConfig, group, clock: StepClock, device):
        self.model = model
        self.net = wrap_ddp(model, cfg, group, clock, device)
        cls, kwargs = optimizer_class(cfg.optimizer)
        self.optimizer = ZeroRedundancyOptimizer(self.net.parameters(), optimizer_class=cls,
                                                 process_group=group, **kwargs)
        self.optimizer.register_step_post_hook(clock.stepped)
        self.schedule = make_schedule(cfg.optimizer, self.optimizer)

    def eval_model(self) -> torch.nn.Module:
        """The model every rank holds (the step ends with every shard's parameters broadcast)."""
        return self.model
