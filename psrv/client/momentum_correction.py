"""Momentum correction with momentum factor masking, the worker's half (Lin et al. 2018, "Deep
Gradient Compression", ICLR, Sec. 3.2; the shard's half: psrv/server/velocity.py).

Where a lossy push codec meets the servers' SGD momentum, error feedback's residual re-enters through
the servers' momentum buffer, which amplifies and delays it. Instead the worker keeps the velocity of
its own gradients, torch SGD's buffer u <- m u + g (weight decay added to g first, as torch does; the
step direction d = u, or g + m u with Nesterov), error feedback compresses d + e, and the shards step
w <- w - lr * mean(pushes) without momentum of their own. With `masking` (DGC's momentum factor masking,
off by default: docs/compression.md has why) a sparse codec (top-k, random-k) also zeroes the velocity
where it sent, so what was sent does not push again through the velocity while the residual is still
catching up. In sync the mean of the velocities is the velocity
of the mean gradient (momentum is linear), so with an identity codec this is the servers' SGD exactly.

The new velocity, like the residual, is kept once the shard applied the push (`settle`): a dropped
push's gradient leaves the velocity as it was, as it leaves the servers' momentum buffer.
"""
from __future__ import annotations

import torch

from psrv.codecs.push import SettledOnAnswer
from psrv.config.optimizer import VELOCITY_RULES as FITTING_RULES  # the others need the raw gradient


class MomentumCorrection(SettledOnAnswer):
    """This worker's velocity over the flat gradient, one shard range at a time."""

    def __init__(self, ranges: list[tuple[int, int]], *, momentum: float, nesterov: bool, weight_decay: float,
                 masking: bool = False):
        total = ranges[-1][1] if ranges else 0
        self.ranges, self.momentum, self.nesterov, self.weight_decay = ranges, momentum, nesterov, weight_decay
        self.masking = masking
        self.velocity = torch.zeros(total, dtype=torch.float32)
        self._next = torch.zeros_like(self.velocity)  # each shard's pending velocity
        self._direction = torch.zeros_like(self.velocity) if nesterov else None
        self._pending: set[int] = set()

    def direction(self, grad: torch.Tensor, weights: torch.Tensor | None, shard: int) -> torch.Tensor:
        """The flat buffer whose shard range is this push's direction: u' = m u + g (g + wd w), then u'
        or g + m u' (Nesterov). u' waits for `settle`."""
        lo, hi = self.ranges[shard]
        if self.velocity.device != grad.device:  # the model's device (a GPU)
            self.velocity, self._next = self.velocity.to(grad.device), self._next.to(grad.device)
            if self._direction is not None:
                self._direction = self._direction.to(grad.device)
        g = grad[lo:hi]
        if self.weight_decay:
            if weights is None:
                raise ValueError("momentum correction with weight decay needs the weights the gradient was "
                                 "computed at (PSClient.push(..., at=weights))")
            g = g.add(weights[lo:hi], alpha=self.weight_decay)
        nxt = torch.mul(self.velocity[lo:hi], self.momentum, out=self._next[lo:hi]).add_(g)
        self._pending.add(shard)
        if self._direction is None:
            return self._next
        torch.add(g, nxt, alpha=self.momentum, out=self._direction[lo:hi])
        return self._direction

    def mask(self, shard: int, chosen: torch.Tensor | None) -> None:
        """Momentum factor masking (with `masking`): zero the pending velocity where a sparse codec sent
        (`chosen`, shard-relative indices); None (sign, int8: every element goes) masks nothing."""
        if self.masking and chosen is not None and chosen.numel():
            lo, hi = self.ranges[shard]
            self._next[lo:hi].index_fill_(0, chosen.to(device=self._next.device, dtype=torch.int64), 0.0)

    def _held(self) -> torch.Tensor:
        return self.velocity

    def state_dict(self) -> dict:
        return {"velocity": self.velocity.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        velocity = state["velocity"]
        if tuple(velocity.shape) != tuple(self.velocity.shape):
            raise ValueError(f"velocity of shape {tuple(velocity.shape)}, this model's is {tuple(self.velocity.shape)}")
        self.velocity.copy_(velocity.to(self.velocity.device))
        self._pending.clear()


def from_welcomes(welcomes: list[dict], ranges: list[tuple[int, int]], *, mode: str,
                  masking: bool = False) -> MomentumCorrection | None:
    """The MomentumCorrection the shards' optimizer asks for (WELCOME's `optimizer`): one where they run
    SGD with momentum, None where they take no momentum; ValueError where they disagree, or where their
    settings need the raw gradient (an update rule other than plain or staleness-lr, sync's clip)."""
    seen = {repr(w.get("optimizer")) for w in welcomes}
    if len(seen) > 1:
        raise ValueError(f"the shards disagree on their optimizer ({', '.join(sorted(seen))}); start them "
                         "with the same settings")
    optim = welcomes[0].get("optimizer") if welcomes else None
    if not optim or optim.get("name") != "sgd" or not optim.get("momentum"):
        return None
    why = ""
    if optim.get("update_rule") not in FITTING_RULES:
        why = f"update rule {optim.get('update_rule')!r} needs the raw gradient"
    elif mode == "sync" and welcomes[0].get("clip_grad_norm"):
        why = "in sync the servers clip each clock's mean gradient (--clip-grad-norm)"
    if why:
        raise ValueError(f"momentum correction (the default with a lossy --compress and SGD momentum) pushes "
                         f"velocities, and {why}: run the workers with --no-momentum-correction "
                         "(psrv.Worker(momentum_correction=False))")
    return MomentumCorrection(ranges, momentum=float(optim["momentum"]), nesterov=bool(optim.get("nesterov")),
                              weight_decay=float(optim.get("weight_decay", 0.0)), masking=masking)
