"""FSDP: torch.distributed.fsdp.fully_shard on the job's model (parameters, gradients and optimizer state
sharded; an all-gather before forward, a reduce-scatter after backward), gloo on CPU and nccl on GPU.

The model is sharded as one unit (the root), so a step has one all-gather and one reduce-scatter; that
reduce-scatter is torch's own, called through `set_custom_reduce_scatter` so that the step clock sees
the end of compute before it (torch's DefaultReduceScatter; the class lives in a private module)."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
from torch.distributed.tensor import DTensor

from psrv.config import RunConfig
from psrv.workers.allreduce.clock import StepClock
from psrv.client.torch_optim import make_schedule, torch_optimizer


class ClockedReduceScatter(DefaultReduceScatter):
    """torch's reduce-scatter, after the step clock's end of compute (faults, net delay, wait barrier)."""

    def __init__(self, clock: StepClock):
        self.clock = clock

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        first = self.clock.compute_end is None
        self.clock.compute_done()
        if first:
            self.clock.reduced += 1
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


class FSDP:
    """The sharded module (`net`), the optimizer over its shards, the schedule, and a plain copy of the
    model that `eval_model` fills with the gathered weights."""

    outer = None

    def __init__(self, model: torch.nn.Module, cfg: RunConfig, group, clock: StepClock, device):
        with torch.no_grad():  # rank 0's start, as DDP's constructor broadcasts it
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, 0, group=group)
        self.plain = copy.deepcopy(model)
        self.net = fully_shard(model, mesh=DeviceMesh.from_group(group, device.type))
        self.net.set_custom_reduce_scatter(ClockedReduceScatter(clock))
        self.optimizer = torch_optimizer(cfg.optimizer, self.net.parameters())
        self.optimizer.register_step_post_hook(clock.stepped)
        self.schedule = make_schedule(cfg.optimizer, self.optimizer)

    def eval_model(self) -> torch.nn.Module:
        """Every rank gathers the whole weights (a collective: all ranks call it) into the plain copy."""
        state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in self.net.state_dict().items()}
        self.plain.load_state_dict(state)
        return self.plain
