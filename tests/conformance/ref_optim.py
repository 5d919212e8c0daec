"""The server's math as the papers and torch's documentation define it, written out here (never by calling
psrv's optimizer, rule or schedule code): one flat parameter vector and its optimizer state.

- SGD (torch.optim.SGD's documented update): d = g + wd w; b = d at the first step, else mu b + d;
  Nesterov: d + mu b, else b; w <- w - lr that.
- Adam / AdamW (Kingma and Ba 2015; Loshchilov and Hutter 2019): m <- b1 m + (1 - b1) g,
  v <- b2 v + (1 - b2) g^2, w <- w - lr/(1 - b1^t) m / (sqrt(v)/sqrt(1 - b2^t) + eps); Adam adds wd w to
  g first, AdamW multiplies w by (1 - lr wd) first.
- 1-bit Adam (Tang et al. 2021), on a parameter server: AdamW on the clock's mean gradient for the first
  K steps; after, the clock's mean of the workers' momenta is m, v stays v_K, and
  w <- w (1 - lr wd) - lr/(1 - b1^t) m / (sqrt(v_K)/sqrt(1 - b2^K) + eps).
- staleness-lr (Zhang et al. 2016): g / max(1, tau). DC-ASGD (Zheng et al. 2017):
  g + lam g g (w - w_bak), lam constant, or lam0 / (sqrt(MS) + 1e-7) with MS <- 0.95 MS + 0.05 g^2.
  Delayed Nesterov (Liu et al. 2024), period N: sum += d (d = g + wd w); t mod N != 0: w -= lr d / N;
  else m <- mu m + sum / N, w -= lr (d / N + mu m), sum <- 0; N = 1 is SGD-Nesterov.
- lr schedule by update count k: warm-up (k + 1)/(W + 1) for k < W, then cosine from lr to 0 over D.
- clip by global norm (torch's clip_grad_norm_): g * min(1, c / (|g| + 1e-6)).
"""
from __future__ import annotations

import math

import torch


def lr_at(o, k: int) -> float:
    if k < o.warmup_steps:
        return o.lr * (k + 1) / (o.warmup_steps + 1)
    if o.lr_schedule == "constant":
        return o.lr
    assert o.lr_schedule == "warmup_cosine", o.lr_schedule
    t, d, f = k - o.warmup_steps, o.lr_decay_steps, o.lr_end_factor
    return o.lr * (f if t >= d else f + (1 - f) * (1 + math.cos(math.pi * t / d)) / 2)


def clipped(g: torch.Tensor, c: float) -> torch.Tensor:
    return g * min(1.0, c / (float(g.norm()) + 1e-6)) if c else g


class ServerMath:
    """One flat vector's optimizer, update rule and update count, for `o` (an OptimConfig)."""

    def __init__(self, o, w: torch.Tensor, *, workers: int, mode: str):
        self.o, self.w, self.k = o, w.clone(), 0
        self.buf: torch.Tensor | None = None
        self.m, self.v = torch.zeros_like(w), torch.zeros_like(w)
        self.bak: dict[int, torch.Tensor] = {}              # dc-asgd: each worker's pulled weights
        self.ms = torch.zeros_like(w)                        # dc-asgd-a's mean square
        self.period = 1 if mode == "sync" else (o.dn_period or workers)
        self.dn_m, self.dn_sum, self.dn_t = torch.zeros_like(w), torch.zeros_like(w), 0
        self.rule = "plain" if mode == "sync" else o.update_rule
        if o.update_rule == "dn":  # sync: dn with N = 1 is SGD-Nesterov, which the rule itself computes
            self.rule = "dn"

    def pulled(self, worker: int) -> None:
        if self.rule in ("dc-asgd", "dc-asgd-a"):
            self.bak[worker] = self.w.clone()

    def step(self, g: torch.Tensor, *, worker: int | None, staleness: int, momentum_push: bool = False) -> None:
        o, lr = self.o, lr_at(self.o, self.k)
        if self.rule == "staleness-lr":
            g = g / max(1, staleness)
        elif self.rule in ("dc-asgd", "dc-asgd-a") and worker is not None and worker in self.bak:
            if self.rule == "dc-asgd-a":
                self.ms = 0.95 * self.ms + 0.05 * g * g
                lam = o.dc_lambda / (self.ms.sqrt() + 1e-7)
            else:
                lam = o.dc_lambda
            g = g + lam * g * g * (self.w - self.bak[worker])
        self.k += 1
        if self.rule == "dn":
            self._dn(g, lr)
        elif o.name == "sgd":
            self._sgd(g, lr)
        elif o.name == "onebit_adam" and momentum_push:
            self._frozen(g, lr)
        else:
            self._adam(g, lr, decoupled=o.name != "adam")

    def _sgd(self, g, lr):
        o = self.o
        d = g + o.weight_decay * self.w if o.weight_decay else g
        if o.momentum:
            self.buf = d.clone() if self.buf is None else o.momentum * self.buf + d
            d = d + o.momentum * self.buf if o.nesterov else self.buf
        self.w = self.w - lr * d

    def _adam(self, g, lr, *, decoupled: bool):
        o, (b1, b2) = self.o, self.o.betas
        if o.weight_decay and not decoupled:
            g = g + o.weight_decay * self.w
        if o.weight_decay and decoupled:
            self.w = self.w * (1 - lr * o.weight_decay)
        t = self.k
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * g * g
        denom = self.v.sqrt() / math.sqrt(1 - b2 ** t) + o.eps
        self.w = self.w - lr / (1 - b1 ** t) * self.m / denom

    def _frozen(self, momentum, lr):
        o, (b1, b2), big_k = self.o, self.o.betas, self.o.freeze_step
        if o.weight_decay:
            self.w = self.w * (1 - lr * o.weight_decay)
        self.m = momentum.clone()
        denom = self.v.sqrt() / math.sqrt(1 - b2 ** big_k) + o.eps
        self.w = self.w - lr / (1 - b1 ** self.k) * self.m / denom

    def _dn(self, g, lr):
        o, n, mu = self.o, self.period, self.o.momentum
        d = g + o.weight_decay * self.w if o.weight_decay else g
        self.dn_t += 1
        self.dn_sum = self.dn_sum + d
        if self.dn_t % n:
            self.w = self.w - lr * d / n
            return
        self.dn_m = mu * self.dn_m + self.dn_sum / n
        self.w = self.w - lr * (d / n + mu * self.dn_m)
        self.dn_sum = torch.zeros_like(self.w)
