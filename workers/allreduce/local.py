"""Local SGD / DiLoCo over all-reduce: no wrapper, each rank steps its inner optimizer, and every
`local_steps` inner steps `OuterAllReduce` averages the pseudo-gradients and takes the servers' outer step."""
from __future__ import annotations

import torch
import torch.distributed as dist

from psrv.config import OptimConfig, RunConfig
from psrv.client.torch_optim import make_schedule, torch_optimizer
from psrv.workers.local_steps import make_inner_optimizer


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
        self.optimizer = torch_optimizer(cfg, self.shared)
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


class LocalSteps:
    """The plain module, the inner optimizer, and the outer all-reduce (`outer`), run every
    cfg.worker.local_steps steps by the loop. Its own `reduced` counts the outer rounds."""

    def __init__(self, model: torch.nn.Module, cfg: RunConfig, group, clock, device):
        self.net = self.model = model
        self.outer = OuterAllReduce(model, cfg.optimizer, group)
        self.optimizer, self.schedule = make_inner_optimizer(cfg.worker, model.parameters()), None
        self.clock = clock

    def eval_model(self) -> torch.nn.Module:
        """The weights as they are (every rank holds its own between rounds; rank 0's are evaluated)."""
        return self.model
