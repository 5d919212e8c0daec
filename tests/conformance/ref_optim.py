"""The server's math as the papers and torch's documentation define it, written out here (never by calling
psrv's optimizer, rule or schedule code): one flat parameter vector and its optimizer state.

- SGD (torch.optim.SGD's documented update): d = g + wd w; b = d at the first step, else mu b + d;
  Nesterov: d + mu b, else b; w <- w - lr that.
- Adam / AdamW (Kingma and Ba 2015; Loshchilov and Hutter 2019): m <- b1 m + (1 - b1) g,
  v <- b2 v + (1 - b2) g^2, w <- w - lr/(1 - b1^t) m / (sqrt(v)/sqrt(1 - b2^t) + eps); Adam adds wd w to
  g first, AdamW multiplies w by (1 - lr wd) first.
- 1-bit Adam (Tang et al. 2021), on a parameter server: AdamW on the clock's mean gradient for the first
  K steps; after, the clock's mean of the workers' momenta is m, save where v_K = 0 (a coordinate whose
  gradient was always 0, whose momentum is 0: DeepSpeed's exp_avg_mask), v stays v_K, and
  w <- w (1 - lr wd) - lr/(1 - b1^t) m / (sqrt(v_K)/sqrt(1 - b2^K) + eps).
- staleness-lr (Zhang et al. 2016): g / max(1, tau). DC-ASGD (Zheng et al. 2017):
  g + lam g g (w - w_bak), lam constant, or lam0 / (sqrt(MS) + 1e-7) with MS <- 0.95 MS + 0.05 g^2.
  Delayed Nesterov (Liu et al. 2024), period N: sum += d (d = g + wd w); t mod N != 0: w -= lr d / N;
  else m <- mu m + sum / N, w -= lr (d / N + mu m), sum <- 0; N = 1 is SGD-Nesterov.
  CGAD (Shah and Sun 2026): g sigma(tau), sigma(tau) = gamma(tau) exp(-alpha tau), gamma the cosine gate from 1
  at tau = 0 to 0 at the cutoff c, (1 + cos(pi tau / c)) / 2, and 0 from c on (c = 0: no gate).
  HeLoCo (Al Asif et al. 2026), per block b of B elements of the slice: u = d_b/|d_b|, v = m_b/|m_b|, c = u.v,
  conf = |d_b| / (|d_b| + kappa |m_b| + 1e-8); c >= c_ok: kept; c < 0: d_b - min(k_s (-c) conf, 1) c |d_b| v;
  else |d_b| t / max(|t|, 1e-8), t = (1 - l) u + l v, l = min(k_d (1 - c) conf, 1); a zero m_b or d_b: kept.
  Then d = that + wd w, m <- mu m + (1 - mu) d, w <- w - lr (d + mu m).
- lr schedule by update count k: warm-up (k + 1)/(W + 1) for k < W, then cosine from lr to 0 over D.
- clip by global norm (torch's clip_grad_norm_): g * min(1, c / (|g| + 1e-6)).

Each update is written with the elementary operations, in the order, of torch's documented single-tensor
implementation (torch.optim.sgd/adam `_single_tensor_*`: lerp, addcmul, addcdiv, add with alpha), so
the reference's weights round as the system's do: a codec's rounding (int8's round, sign's sign,
top-k's choice) then sees the same values on both sides, and a flip there is a real difference.

The settings come from two places only (`settings`): those tests/conformance/axes.py's run_config states in
every case (STATED), read from the case's config, and every other from DOCUMENTED, torch's documentation
and the papers, never psrv's filled-in defaults (a wrong default there would be mirrored here, not caught;
tests/conformance/test_defaults.py holds psrv's defaults to this table).
"""
from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import torch

DOCUMENTED = {
    "betas": (0.9, 0.999),    # torch.optim.Adam and AdamW: betas=(0.9, 0.999); Kingma and Ba 2015, Algorithm 1
    "eps": 1e-8,              # torch.optim.Adam and AdamW: eps=1e-8; Kingma and Ba 2015, Algorithm 1
    "momentum": 0.0,          # torch.optim.SGD: momentum=0 (psrv's sgd takes 0.9: stated, PSRV_DIFFERS)
    "nesterov": False,        # torch.optim.SGD: nesterov=False
    "lr_end_factor": 0.0,     # cosine to 0: torch.optim.lr_scheduler.CosineAnnealingLR's eta_min=0 (SGDR's eta_min)
    "dc_lambda": {"dc-asgd": 0.04, "dc-asgd-a": 2.0},  # Zheng et al. 2017, CIFAR-10: lambda 0.04 (DC-ASGD-c), lambda0 2
    # (DC-ASGD-a); the cases state larger ones (axes.DC_LAMBDA), under which the compensation shows over the tolerance
    "dc_mean_square": 0.95,   # Zheng et al. 2017, DC-ASGD-a: MeanSquare <- m MeanSquare + (1 - m) g^2, m = 0.95
    "dc_eps": 1e-7,           # Zheng et al. 2017, DC-ASGD-a: lambda0 / (sqrt(MeanSquare) + eps), eps = 1e-7
}
# psrv's own documented value where it differs on purpose (--momentum's help: "default: 0.9 with sgd"): the cases
# state it
PSRV_DIFFERS = {"momentum": 0.9}
STATED = ("name", "lr", "weight_decay", "clip_grad_norm", "update_rule", "lr_schedule", "warmup_steps",
          "lr_decay_steps", "momentum", "nesterov", "freeze_step", "dc_lambda", "cgad_alpha", "cgad_cutoff", "heloco_keep", "heloco_shrink", "heloco_reorient",
          "heloco_kappa", "heloco_block")


def settings(o) -> SimpleNamespace:
    """The optimizer settings the reference runs for `o` (an OptimConfig): the STATED ones from it, the others
    DOCUMENTED."""
    return SimpleNamespace(**{**DOCUMENTED, **{key: getattr(o, key) for key in STATED}})


def lr_at(o, k: int) -> float:
    if k < o.warmup_steps:
        return o.lr * ((k + 1) / (o.warmup_steps + 1))
    if o.lr_schedule == "constant":
        return o.lr
    assert o.lr_schedule == "warmup_cosine", o.lr_schedule
    t, d, f = k - o.warmup_steps, o.lr_decay_steps, o.lr_end_factor
    return o.lr * (f if t >= d else f + (1.0 - f) * (1.0 + math.cos(math.pi * t / d)) / 2)


def cgad_sigma(tau: int, alpha: float, cutoff: int) -> float:
    if cutoff and tau >= cutoff:
        return 0.0
    gate = (1.0 + math.cos(math.pi * tau / cutoff)) / 2 if cutoff else 1.0  # as a float: rounded as psrv's is
    return gate * math.exp(-alpha * tau)


def heloco_corrected(g: torch.Tensor, m: torch.Tensor, o, slices) -> tuple[torch.Tensor, Counter]:
    """HeLoCo's correction of `g` against the outer momentum `m`, block by block within each shard's slice
    ((lo, hi) of the vector), and the blocks per case. The formulas are the paper's; their float arithmetic runs
    in one fixed order (the cosine as d·m̂ / |d|, each block a tensor of its own, as a shard holds its slice), the
    order psrv's rounds in, so that the two agree to the bit: a top-k pull after a heloco step meets hundreds of
    elements tied at the k-th magnitude, and a difference of one ulp would rank them differently (the case in
    docs/architecture.md, "The conformance matrix", disagreed by 2.6e-4 before)."""
    out, cases = g.clone(), Counter()
    for start, end in slices:
        size = o.heloco_block or max(1, end - start)
        for lo in range(start, end, size):
            hi = min(lo + size, end)
            d, mb = g[lo:hi].clone(), m[lo:hi].clone()
            nd, nm = float(d.norm()), float(mb.norm())
            if nd == 0 or nm == 0:
                cases["kept"] += 1
                continue
            u, v = d / nd, mb / nm
            c = float(torch.dot(d, v)) / nd
            conf = nd / (nd + o.heloco_kappa * nm + 1e-8)
            beta = min(o.heloco_shrink * -c * conf, 1.0)
            lam = min(o.heloco_reorient * (1 - c) * conf, 1.0)
            if c >= o.heloco_keep:
                cases["kept"] += 1
            elif c < 0 and beta > 0:
                out[lo:hi] = d.add(v, alpha=-beta * c * nd)
                cases["shrunk"] += 1
            elif c >= 0 and lam > 0:
                t = u.mul(1 - lam).add(v, alpha=lam)
                out[lo:hi] = t.mul(nd / max(float(t.norm()), 1e-8))
                cases["reoriented"] += 1
            else:  # a strength of 0 moves nothing
                cases["kept"] += 1
    return out, cases


def clipped(g: torch.Tensor, c: float) -> torch.Tensor:
    if not c:
        return g
    norm = torch.linalg.vector_norm(g, 2.0)
    return g * torch.clamp(c / (norm + 1e-6), max=1.0)


class ServerMath:
    """One flat vector's optimizer, update rule and update count, for `o` (the reference's `settings`)."""

    def __init__(self, o, w: torch.Tensor, *, workers: int, mode: str):
        self.o, self.w, self.k = o, w.clone(), 0
        self.buf: torch.Tensor | None = None
        self.m, self.v = torch.zeros_like(w), torch.zeros_like(w)
        self.bak: dict[int, torch.Tensor] = {}              # dc-asgd: each worker's pulled weights
        self.ms = torch.zeros_like(w)                        # dc-asgd-a's mean square
        self.period = 1 if mode == "sync" else workers  # dn's N: a round of every worker's push (Liu et al. 2024)
        self.dn_m, self.dn_sum, self.dn_t = torch.zeros_like(w), torch.zeros_like(w), 0
        self.heloco_m, self.heloco_cases = torch.zeros_like(w), Counter()  # heloco's momentum, its blocks per case
        self.slices = [(0, len(w))]  # each shard's slice of w (heloco's blocks lie within one)
        self.warm: int | None = None  # 1-bit Adam: the Adam steps before the first frozen one
        self.lr_scales: Counter = Counter()  # each update's lr scale by the rule (staleness-lr: 1/tau; dn: 1/N)
        self.rule = o.update_rule if mode != "sync" or o.update_rule == "dn" else "plain"

    def pulled(self, worker: int, held: torch.Tensor | None = None) -> None:
        """`worker` now holds `held` (default the weights; under compressed pulls with error feedback its copy)."""
        if self.rule in ("dc-asgd", "dc-asgd-a"):
            self.bak[worker] = (self.w if held is None else held).clone()

    def step(self, g: torch.Tensor, *, worker: int | None, staleness: int, momentum_push: bool = False,
             velocity: bool = False) -> None:
        o, lr = self.o, lr_at(self.o, self.k)
        scale = (1.0 / max(1, staleness) if self.rule == "staleness-lr" else 1.0 / self.period if self.rule == "dn"
                 else cgad_sigma(staleness, o.cgad_alpha, o.cgad_cutoff) if self.rule == "cgad" else 1.0)
        self.lr_scales[f"{round(scale, 6):g}"] += 1
        if self.rule == "staleness-lr" and staleness > 1:
            g = torch.div(g, staleness)
        elif self.rule == "cgad" and scale != 1.0:
            g = torch.mul(g, scale)
        elif self.rule == "heloco":
            g, cases = heloco_corrected(g, self.heloco_m, o, self.slices)
            self.heloco_cases.update(cases)
        elif self.rule in ("dc-asgd", "dc-asgd-a") and worker is not None and worker in self.bak:
            if self.rule == "dc-asgd-a":
                self.ms.mul_(o.dc_mean_square).addcmul_(g, g, value=1 - o.dc_mean_square)
                lam = torch.sqrt(self.ms).add_(o.dc_eps).reciprocal_().mul_(o.dc_lambda)
            else:
                lam = o.dc_lambda
            g = torch.add(g, torch.sub(self.w, self.bak[worker]).mul_(g).mul_(g).mul_(lam))
        self.k += 1
        if velocity:  # a worker's velocity (momentum correction): plain SGD, no momentum or decay here
            self.w.add_(g, alpha=-lr)
        elif self.rule == "dn":
            self._dn(g, lr)
        elif self.rule == "heloco":
            d = g.add(self.w, alpha=o.weight_decay) if o.weight_decay else g
            self.heloco_m.mul_(o.momentum).add_(d, alpha=1 - o.momentum)
            self.w.add_(d.add(self.heloco_m, alpha=o.momentum), alpha=-lr)
        elif o.name == "sgd":
            self._sgd(g, lr)
        elif o.name == "onebit_adam" and momentum_push:
            self._frozen(g, lr)
        else:
            self._adam(g, lr, decoupled=o.name != "adam")

    def _sgd(self, g, lr):
        o = self.o
        d = g.add(self.w, alpha=o.weight_decay) if o.weight_decay else g
        if o.momentum:
            if self.buf is None:
                self.buf = d.clone()
            else:
                self.buf.mul_(o.momentum).add_(d)
            d = d.add(self.buf, alpha=o.momentum) if o.nesterov else self.buf
        self.w.add_(d, alpha=-lr)

    def _adam(self, g, lr, *, decoupled: bool):
        o, (b1, b2) = self.o, self.o.betas
        if o.weight_decay and decoupled:
            self.w.mul_(1 - lr * o.weight_decay)
        elif o.weight_decay:
            g = g.add(self.w, alpha=o.weight_decay)
        t = float(self.k)
        self.m.lerp_(g, 1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (self.v.sqrt() / (1 - b2 ** t) ** 0.5).add_(o.eps)
        self.w.addcdiv_(self.m, denom, value=-(lr / (1 - b1 ** t)))

    def _frozen(self, momentum, lr):
        o, (b1, b2) = self.o, self.o.betas
        if self.warm is None:  # the Adam steps v took: K, or fewer where a warm-up clock had no step
            self.warm = self.k - 1
        big_k = max(1, self.warm)
        if o.weight_decay:
            self.w.mul_(1 - lr * o.weight_decay)
        self.m = torch.where(self.v == 0, torch.zeros_like(momentum), momentum)
        denom = (self.v.sqrt() / math.sqrt(1 - b2 ** big_k)).add_(o.eps)
        self.w.addcdiv_(self.m, denom, value=-lr / (1 - b1 ** float(self.k)))

    def _dn(self, g, lr):
        o, n, mu = self.o, self.period, self.o.momentum
        d = g.add(self.w, alpha=o.weight_decay) if o.weight_decay else g
        self.dn_t += 1
        if n == 1:  # SGD-Nesterov
            self.dn_m.mul_(mu).add_(d)
            self.w.add_(d.add(self.dn_m, alpha=mu), alpha=-lr)
            return
        self.dn_sum.add_(d)
        if self.dn_t % n:
            self.w.add_(d, alpha=-lr / n)
            return
        self.dn_m.mul_(mu).add_(self.dn_sum, alpha=1.0 / n)
        self.w.add_(torch.div(d, n).add_(self.dn_m, alpha=mu), alpha=-lr)
        self.dn_sum.zero_()
