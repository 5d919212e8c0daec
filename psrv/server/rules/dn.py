"""`dn`: Delayed Nesterov, Liu, Chhaparia, Douillard et al., "Asynchronous Local-SGD Training for
Language Modeling" (2024, arXiv:2401.09135), the outer optimizer of asynchronous local SGD (DiLoCo).

Plain Nesterov on every push applies the momentum once per push, N times per round of N workers,
each time on a stale direction. DN updates the momentum once every N pushes, with the mean of the N
pseudo-gradients buffered since the last update, and steps each push in between without momentum:

    push t (t = 1, 2, ...), pseudo-gradient Δ_t:   Δ_sum ← Δ_sum + Δ_t
    t mod N ≠ 0:   w ← w − lr · Δ_t / N
    t mod N = 0:   m ← β · m + Δ_sum / N;   w ← w − lr · (Δ_t / N + β · m);   Δ_sum ← 0

(the paper's momentum activation c at 0). Over N pushes the weights move by −lr · (Δ̄ + β · m): one
Nesterov step on their mean Δ̄. With N = 1 it is torch's SGD with Nesterov momentum (dampening 0),
m ← β·m + Δ, w ← w − lr·(Δ + β·m), the same operations in the same order; with β = 0 it is plain
SGD at lr/N. Weight decay is added to Δ_t first, as torch's SGD does. N = cfg.dn_period (a server is
told it: --dn-period, or the number of workers; 1 in sync mode); 0 (a shard built without a
ServerConfig) is taken as 1. The lr scale recorded per push is 1/N.
"""
from __future__ import annotations

import torch

from psrv.server.rules.base import UpdateRule, register


@register
class DelayedNesterov(UpdateRule):
    name = "dn"

    def __init__(self, cfg, size, device):
        super().__init__(cfg, size, device)
        self.period = max(1, cfg.dn_period)
        self.pushes = 0  # t, the pushes stepped so far
        self.momentum = torch.zeros(size, dtype=torch.float32, device=device)  # m
        self.buffered = torch.zeros(size, dtype=torch.float32, device=device)  # Δ_sum

    def prepare(self, grad, ctx, weights, out):
        return grad, 1.0 / self.period

    def step(self, grad, optimizer) -> None:
        w, beta, n, lr = optimizer.param.data, self.cfg.momentum, self.period, optimizer.lr
        with torch.no_grad():
            if self.cfg.weight_decay:
                grad = grad.add(w, alpha=self.cfg.weight_decay)
            self.pushes += 1
            if n == 1:  # torch.optim.sgd's nesterov step, bit for bit
                self.momentum.mul_(beta).add_(grad)
                w.add_(grad.add(self.momentum, alpha=beta), alpha=-lr)
                return
            self.buffered.add_(grad)
            if self.pushes % n:
                w.add_(grad, alpha=-lr / n)
                return
            self.momentum.mul_(beta).add_(self.buffered, alpha=1.0 / n)
            w.add_(torch.div(grad, n).add_(self.momentum, alpha=beta), alpha=-lr)
            self.buffered.zero_()

    def state_dict(self) -> dict:
        return {"name": self.name, "pushes": self.pushes, "momentum": self.momentum, "buffered": self.buffered}

    def load_state_dict(self, state: dict) -> None:
        for key in ("momentum", "buffered"):
            if tuple(state[key].shape) != (self.size,):
                raise ValueError(f"rule state {key} has shape {tuple(state[key].shape)}, this shard {self.size}")
        self.pushes = int(state["pushes"])
        self.momentum = state["momentum"].to(self.device, torch.float32).clone()
        self.buffered = state["buffered"].to(self.device, torch.float32).clone()
