"""1-bit Adam, the worker's half (the server's: psrv/server/onebit_adam.py). Each worker keeps its own
momentum of its own gradients from step 0, m_i <- b1 m_i + (1 - b1) g_i (torch Adam's lerp). Momentum
is linear, so the mean of the m_i over the workers is exactly the momentum of the mean gradient that
the servers' Adam keeps during the warm-up. Pushes of clocks below the freeze step are the gradient,
dense; later ones are m_i, compressed with error feedback by the push codec (scaled sign by default,
psrv/codecs/push.py), and the shard's mean of them is its new momentum: no momentum is ever pulled.

This differs from DeepSpeed's OnebitAdam, where each worker's momentum restarts every step from the
compressed average (m_i <- b1 m + (1 - b1) g_i) and the average is compressed once more on its way
back (a server error buffer): a parameter server sends weights back, never the momentum.
"""
from __future__ import annotations

import torch


class LocalMomentum:
    """This worker's momentum m_i over the flat gradient, one shard range at a time."""

    def __init__(self, total: int, *, beta1: float, freeze_step: int):
        self.beta1, self.freeze_step = float(beta1), int(freeze_step)
        self.momentum = torch.zeros(total, dtype=torch.float32)

    def is_momentum(self, clock: int) -> bool:
        """True when the push of `clock` is the momentum (the servers' variance is frozen by then)."""
        return clock >= self.freeze_step

    def update(self, grad: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """m_i[lo:hi] <- b1 m_i + (1 - b1) grad[lo:hi]; returns the whole flat m_i (the codec takes its slice)."""
        if self.momentum.device != grad.device:  # the model's device (a GPU)
            self.momentum = self.momentum.to(grad.device)
        self.momentum[lo:hi].lerp_(grad[lo:hi], 1 - self.beta1)
        return self.momentum

    def state_dict(self) -> dict:
        return {"momentum": self.momentum.detach().cpu().clone(), "freeze_step": self.freeze_step}

    def load_state_dict(self, state: dict) -> None:
        momentum = state["momentum"]
        if tuple(momentum.shape) != tuple(self.momentum.shape):
            raise ValueError(f"momentum of shape {tuple(momentum.shape)}, this model's is {tuple(self.momentum.shape)}")
        self.momentum.copy_(momentum.to(self.momentum.device))


def from_welcomes(welcomes: list[dict], total: int) -> LocalMomentum | None:
    """The LocalMomentum WELCOME's `onebit` asks for (None: the shards run another optimizer);
    ValueError where the shards disagree."""
    seen = {repr(w.get("onebit")) for w in welcomes}
    if len(seen) > 1:
        raise ValueError(f"the shards disagree on onebit_adam ({', '.join(sorted(seen))}); start them with one "
                         "--optimizer and --freeze-step")
    onebit = welcomes[0].get("onebit") if welcomes else None
    if not onebit:
        return None
    return LocalMomentum(total, beta1=onebit["beta1"], freeze_step=onebit["freeze_step"])
