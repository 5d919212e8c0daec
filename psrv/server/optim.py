"""Server-side optimizers: torch.optim's own update functions, stepping one flat vector in place.

`FlatOptimizer` calls torch.optim's functional forms (`torch.optim.sgd.sgd`, `torch.optim.adam.adam`),
the very functions torch.optim.SGD/Adam/AdamW.step call, so the server's step equals a worker-side
torch.optim step by construction, and it allocates nothing per step. onebit_adam is Adam (AdamW's
weight decay) until its freeze step, then psrv/server/onebit_adam.py's frozen-variance step. It keeps the state itself, in
torch.optim's state_dict layout. Why not the classes: their step and add_param_group import
torch._dynamo on first use, 2.6 s of every server's start-up on this machine; these functions don't.

Large shards take torch's fused kernels (one pass over memory: Adam 6.5x faster than the default
at 64 MB here); small ones don't, because a fused step has a fixed cost of about 5 ms on this 2-core
machine against 0.1 ms for the single-tensor one.
"""
from __future__ import annotations

import torch
from torch.optim.adam import adam as adam_update
from torch.optim.sgd import sgd as sgd_update

from psrv.config import OPTIMIZERS, OptimConfig
from psrv.server.onebit_adam import frozen_step, is_frozen

FUSED_MIN_ELEMENTS = 1 << 20


class FlatOptimizer:
    def __init__(self, cfg: OptimConfig, param: torch.Tensor, *, fused: bool):
        self.cfg, self.param, self.fused = cfg, param, fused
        self.lr = cfg.lr  # the next step's; the shard sets it from the schedule (psrv/schedule.py)
        self.state: dict[str, torch.Tensor] = {}

    def divides(self) -> bool:
        """Whether `step(grad, divisor=n)` divides inside the optimizer's own pass over memory (a fused
        sgd/adam/adamw kernel's grad_scale) rather than in a pass of its own."""
        return self.fused and self.cfg.name in ("sgd", "adam", "adamw")

    def step(self, grad: torch.Tensor, *, frozen: bool | None = None, divisor: float = 1.0) -> None:
        """One step of cfg's rule with `grad` / `divisor` (float32, on the parameter's device), at `self.lr`;
        `grad` is left holding the quotient. A fused kernel divides in its own pass (its grad_scale:
        element by element the same division, so bit for bit the same step: tests/conformance/test_optim_edges.py),
        else `grad` is divided first. onebit_adam: `frozen` says whether grad is the workers' momentum
        (their clock is past the freeze; None: as many Adam steps as the freeze step are in the state)."""
        c = self.cfg
        kernel = {"fused": True, "foreach": False} if self.fused else {"fused": False, "foreach": False}
        scale = {}
        if divisor != 1.0:
            if self.divides():
                scale = {"grad_scale": torch.tensor(float(divisor), dtype=torch.float32, device=grad.device)}
            else:
                grad.div_(divisor)
        with torch.no_grad():
            if c.name == "sgd":
                buffers = [self.state.get("momentum_buffer")]
                sgd_update([self.param], [grad], buffers, **kernel, **scale, weight_decay=c.weight_decay,
                                    momentum=c.momentum, lr=self.lr, dampening=0.0, nesterov=c.nesterov, maximize=False)
                if c.momentum != 0:
                    self.state["momentum_buffer"] = buffers[0]
                return
            if not self.state:
                self._init_adam()
            s = self.state
            if c.name == "onebit_adam" and (is_frozen(s, c.freeze_step) if frozen is None else frozen):  # grad: the momentum
                frozen_step(s, self.param, grad, lr=self.lr, betas=c.betas, eps=c.eps, weight_decay=c.weight_decay)
                return
            adam_update([self.param], [grad], [s["exp_avg"]], [s["exp_avg_sq"]], [], [s["step"]], **kernel, **scale,
                                  decoupled_weight_decay=c.name != "adam", amsgrad=False, beta1=c.betas[0],
                                  beta2=c.betas[1], lr=self.lr, weight_decay=c.weight_decay, eps=c.eps, maximize=False)

    def plain_step(self, grad: torch.Tensor) -> None:
        """w <- w - lr * grad: SGD without momentum or weight decay, for a push that is a worker's velocity
        (momentum correction, psrv/server/velocity.py: the momentum and weight decay are in it already)."""
        if self.cfg.name != "sgd":
            raise ValueError(f"a velocity is stepped by sgd only; this shard runs {self.cfg.name}")
        kernel = {"fused": self.fused, "foreach": False}
        with torch.no_grad():
            sgd_update([self.param], [grad], [None], **kernel, weight_decay=0.0, momentum=0.0, lr=self.lr,
                       dampening=0.0, nesterov=False, maximize=False)

    def step_slice(self, grad: torch.Tensor, lo: int, hi: int) -> None:
        """The step of one push on the elements [lo, hi) only (a chunked push, psrv/server/pushes/chunked.py):
        torch.optim's same functions on views of the parameter and its state, element by element the
        math `step` does. The step count is the push's: every slice of a push sees the same count,
        and `end_slices()` advances it once the push is whole. sgd and adam/adamw only."""
        c = self.cfg
        kernel = {"fused": self.fused, "foreach": False}
        param = self.param[lo:hi]
        with torch.no_grad():
            if c.name == "sgd":
                if c.momentum != 0 and "momentum_buffer" not in self.state:  # zero: its first step is then
                    self.state["momentum_buffer"] = torch.zeros_like(self.param)  # the gradient, as torch's clone
                buffers = [self.state["momentum_buffer"][lo:hi] if c.momentum != 0 else None]
                sgd_update([param], [grad], buffers, **kernel, weight_decay=c.weight_decay, momentum=c.momentum,
                           lr=self.lr, dampening=0.0, nesterov=c.nesterov, maximize=False)
                return
            if c.name not in ("adam", "adamw"):
                raise ValueError(f"{c.name} takes pushes whole")
            if not self.state:
                self._init_adam()
            s = self.state
            step = s["step"].clone()  # torch.optim advances it in place; the push's own count does
            adam_update([param], [grad], [s["exp_avg"][lo:hi]], [s["exp_avg_sq"][lo:hi]], [], [step], **kernel,
                        decoupled_weight_decay=c.name != "adam", amsgrad=False, beta1=c.betas[0],
                        beta2=c.betas[1], lr=self.lr, weight_decay=c.weight_decay, eps=c.eps, maximize=False)

    def end_slices(self) -> None:
        """A chunked push is whole: its step count, taken by every slice, is now the optimizer's."""
        if "step" in self.state:
            self.state["step"] += 1

    def _init_adam(self) -> None:
        """What Adam._init_group makes at the first step."""
        self.state = {"step": torch.zeros((), dtype=torch.float32, device=self.param.device)
                      if self.fused else torch.tensor(0.0, dtype=torch.float32),
                      "exp_avg": torch.zeros_like(self.param), "exp_avg_sq": torch.zeros_like(self.param)}

    def state_dict(self) -> dict:
        """torch.optim's layout: {"state": {0: {...}}, "param_groups": [{..., "params": [0]}]}."""
        c = self.cfg
        group = {"lr": self.lr, "weight_decay": c.weight_decay, "params": [0]}
        group.update({"momentum": c.momentum, "nesterov": c.nesterov} if c.name == "sgd" else
                     {"betas": tuple(c.betas), "eps": c.eps})
        return {"state": {0: dict(self.state)} if self.state else {}, "param_groups": [group]}

    def load_state_dict(self, state: dict) -> None:
        slot = state.get("state", {}).get(0, {})
        self.state = {k: v.to(self.param.device).clone() if k != "step" or self.fused else v.clone().cpu()
                      for k, v in slot.items()}


def flat_optimizer(cfg: OptimConfig, param: torch.Tensor, *, fused: bool | None = None) -> FlatOptimizer:
    """The optimizer `cfg` names, over the single flat `param` (fused: None picks by size)."""
    if cfg.name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {cfg.name!r}")
    return FlatOptimizer(cfg, param, fused=param.numel() >= FUSED_MIN_ELEMENTS if fused is None else fused)
