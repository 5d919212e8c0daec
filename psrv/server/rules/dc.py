"""`dc-asgd` and `dc-asgd-a`: Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay
Compensation" (ICML 2017). The gradient g, computed at the weights w_bak the worker pulled, is
corrected towards the gradient at the weights w now with the diagonal approximation of the Hessian:

    g ← g + λ · g ⊙ g ⊙ (w − w_bak(worker))

dc-asgd takes a constant λ (the paper's DC-ASGD-c, λ0 = 0.04 in its CIFAR-10 runs); dc-asgd-a the
adaptive λ_t = λ0 / (√MeanSquare_t + 1e-7), elementwise, MeanSquare_t = m · MeanSquare_{t−1} +
(1 − m) · g ⊙ g with m = 0.95, updated with each gradient before it is used (DC-ASGD-a, λ0 = 2).

w_bak(worker) is recorded when that worker's pull is answered: the weights it got. A sync clock's mean
(worker None) and a worker with no recorded pull get no correction: in sync mode w = w_bak, the
correction is 0, and both rules are plain (MeanSquare is not updated there either).
"""
from __future__ import annotations

import torch

from psrv.server.rules.base import PushContext, UpdateRule, register

MEAN_SQUARE_MOMENTUM = 0.95
EPS = 1e-7


@register
class DCASGD(UpdateRule):
    name = "dc-asgd"
    records_pulls = True

    def __init__(self, cfg, size, device):
        super().__init__(cfg, size, device)
        self.pulled_weights: dict[int, torch.Tensor] = {}
        self._term: torch.Tensor | None = None

    def pulled(self, worker: int, weights: torch.Tensor) -> None:
        kept = self.pulled_weights.get(worker)
        if kept is None:
            self.pulled_weights[worker] = weights.detach().clone()
        else:
            kept.copy_(weights)

    def lam(self, grad: torch.Tensor) -> float | torch.Tensor:
        return self.cfg.dc_lambda

    def prepare(self, grad, ctx: PushContext, weights, out):
        if ctx.worker is None:
            return grad, 1.0
        lam = self.lam(grad)
        kept = self.pulled_weights.get(ctx.worker)
        if kept is None:
            return grad, 1.0
        if self._term is None:
            self._term = torch.empty(self.size, dtype=torch.float32, device=self.device)
        term = torch.sub(weights, kept, out=self._term).mul_(grad).mul_(grad).mul_(lam)
        return torch.add(grad, term, out=out()), 1.0

    def state_dict(self) -> dict:
        return {"name": self.name, "pulled": {int(w): t for w, t in self.pulled_weights.items()}}

    def load_state_dict(self, state: dict) -> None:
        for w, t in state.get("pulled", {}).items():
            if tuple(t.shape) != (self.size,):
                raise ValueError(f"rule state pulled[{w}] has shape {tuple(t.shape)}, this shard {self.size}")
        self.pulled_weights = {int(w): t.to(self.device, torch.float32).clone()
                               for w, t in state.get("pulled", {}).items()}


@register
class DCASGDAdaptive(DCASGD):
    name = "dc-asgd-a"

    def __init__(self, cfg, size, device):
        super().__init__(cfg, size, device)
        self.mean_square = torch.zeros(size, dtype=torch.float32, device=device)
        self._lam = torch.empty(size, dtype=torch.float32, device=device)

    def lam(self, grad: torch.Tensor) -> torch.Tensor:
        m = MEAN_SQUARE_MOMENTUM
        self.mean_square.mul_(m).addcmul_(grad, grad, value=1 - m)
        return torch.sqrt(self.mean_square, out=self._lam).add_(EPS).reciprocal_().mul_(self.cfg.dc_lambda)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "mean_square": self.mean_square}

    def load_state_dict(self, state: dict) -> None:
        ms = state.get("mean_square")
        if ms is not None and tuple(ms.shape) != (self.size,):
            raise ValueError(f"rule state mean_square has shape {tuple(ms.shape)}, this shard {self.size}")
        super().load_state_dict(state)
        if ms is not None:
            self.mean_square = ms.to(self.device, torch.float32).clone()
