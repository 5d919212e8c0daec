"""`heloco`: HeLoCo (Al Asif, Diem, Muñoz, Wolf, Jannesari, Mazaheri, "HeLoCo: Efficient asynchronous
low-communication training under data and device heterogeneity", arXiv 2606.00271, 2026). A stale
pseudo-gradient Δ is corrected, block by block, against the outer momentum m before the outer step:

    c_b = cos(Δ_b, m_b),  conf_b = |Δ_b| / (|Δ_b| + κ |m_b| + ε)
    c_b ≥ c_ok:        Δ̂_b = Δ_b                                         (aligned: kept)
    c_b < 0:           Δ̂_b = Δ_b − β_b c_b |Δ_b| m̂_b,  β_b = min(k_s (−c_b) conf_b, β_max)   (shrunk)
    0 ≤ c_b < c_ok:    Δ̂_b = |Δ_b| ũ_b / max(|ũ_b|, ε),  ũ_b = (1 − λ_b) Δ_b/|Δ_b| + λ_b m̂_b,
                       λ_b = min(k_d (1 − c_b) conf_b, 1)                 (turned toward m̂_b, its norm kept)
    m ← μ m + (1 − μ) Δ̂;   w ← w − lr (Δ̂ + μ m)                         (the outer Nesterov step)

The paper's blocks are tensors; a shard holds a flat slice of the model and knows no tensor bounds, so
psrv's blocks are runs of `heloco_block` elements of the slice (0: the whole slice). β_max is 1: the most
the shrink can remove is Δ_b's whole component against m_b. A block where m_b or Δ_b is zero (the first
push) is kept. The rule keeps m and steps in place of the optimizer (as dn does); it needs sgd with
nesterov, μ = --momentum; weight decay is added to Δ̂ first, as torch's SGD does. With k_s = k_d = 0 no
block changes, and the step is the paper's uncorrected outer Nesterov step (its momentum dampened by 1 − μ,
unlike torch's SGD). Formulas and defaults: docs/algorithms.md."""
from __future__ import annotations

import torch

from psrv.server.rules.base import UpdateRule, register

SHRINK_CAP = 1.0  # β_max
EPS = 1e-8        # ε
BRANCHES = ("kept", "shrunk", "reoriented")


def correct(delta: torch.Tensor, m: torch.Tensor, cfg, out: torch.Tensor) -> list[int]:
    """Write Δ̂ (delta corrected against m, block by block) into `out`; returns the blocks per branch
    (BRANCHES order), a block counted as changed only where its strength moved it (β or λ above 0)."""
    counts = [0, 0, 0]
    size = cfg.heloco_block or max(1, delta.numel())
    out.copy_(delta)
    for lo in range(0, delta.numel(), size):
        d, v = delta[lo:lo + size], m[lo:lo + size]
        dn, mn = torch.linalg.vector_norm(d).item(), torch.linalg.vector_norm(v).item()
        if dn == 0.0 or mn == 0.0:
            counts[0] += 1
            continue
        v_hat = v / mn
        c = torch.dot(d, v_hat).item() / dn
        conf = dn / (dn + cfg.heloco_kappa * mn + EPS)
        beta = min(cfg.heloco_shrink * (-c) * conf, SHRINK_CAP) if c < 0 else 0.0
        lam = min(cfg.heloco_reorient * (1.0 - c) * conf, 1.0) if 0 <= c < cfg.heloco_keep else 0.0
        if c >= cfg.heloco_keep or not (beta or lam):  # aligned, or a strength of 0: the block as it came
            counts[0] += 1
        elif beta:
            out[lo:lo + size].add_(v_hat, alpha=-beta * c * dn)
            counts[1] += 1
        else:
            u = (d / dn).mul_(1.0 - lam).add_(v_hat, alpha=lam)
            out[lo:lo + size].copy_(u.mul_(dn / max(torch.linalg.vector_norm(u).item(), EPS)))
            counts[2] += 1
    return counts


@register
class HeLoCo(UpdateRule):
    name = "heloco"

    def __init__(self, cfg, size, device):
        super().__init__(cfg, size, device)
        self.momentum = torch.zeros(size, dtype=torch.float32, device=device)  # m, the paper's (dampened)
        self.blocks = dict.fromkeys(BRANCHES, 0)  # blocks per branch, over every push

    def prepare(self, grad, ctx, weights, out):
        buf = out()
        for branch, n in zip(BRANCHES, correct(grad, self.momentum, self.cfg, buf)):
            self.blocks[branch] += n
        return buf, 1.0

    def step(self, grad, optimizer) -> None:
        w, mu, lr = optimizer.param.data, self.cfg.momentum, optimizer.lr
        with torch.no_grad():
            if self.cfg.weight_decay:
                grad = grad.add(w, alpha=self.cfg.weight_decay)
            self.momentum.mul_(mu).add_(grad, alpha=1.0 - mu)
            w.add_(grad.add(self.momentum, alpha=mu), alpha=-lr)

    def counts(self) -> dict[str, int]:
        """Blocks kept, shrunk and turned over every push."""
        return {f"blocks_{branch}": n for branch, n in self.blocks.items()}

    def state_dict(self) -> dict:
        return {"name": self.name, "momentum": self.momentum, **self.blocks}

    def load_state_dict(self, state: dict) -> None:
        if tuple(state["momentum"].shape) != (self.size,):
            raise ValueError(f"rule state momentum has shape {tuple(state['momentum'].shape)}, this shard {self.size}")
        self.momentum = state["momentum"].to(self.device, torch.float32).clone()
        self.blocks = {branch: int(state[branch]) for branch in BRANCHES}
