"""1-bit Adam, the worker's half (the server's: psrv/server/onebit_adam.py). Each worker keeps its own
momentum of its own gradients from step 0, m_i <- b1 m_i + (1 - b1) g_i (torch Adam's lerp). Momentum
is linear, so the mean of the m_i over the workers is exactly the momentum of the mean gradient that
the servers' Adam keeps during the warm-up. Pushes of clocks below the freeze step are the gradient,
dense; later ones are m_i, compressed with error feedback by the push codec (scaled sign by default,
psrv/codecs/push.py), and the shard's mean of them is its new momentum: no momentum is ever pulled.

This differs from DeepSpeed's OnebitAdam, where each worker's momentum restarts every step from the
compressed average (m_i <- b1 m + (1 - b1) g_i) and the average is compressed once more on its way
back (a server error buffer): a parameter server sends weights back, never the momentum.

The protocol: WELCOME's `onebit` (`from_welcomes`) gives the freeze step and beta1, and a push past the
freeze says it is a momentum (field `momentum`, `LocalMomentum.mark`), which the shard checks against its
clock (psrv/server/onebit_adam.py check_push). PSClient (psrv/client/psclient.py, its pushes
psrv/client/push_messages.py) calls these.
"""
from __future__ import annotations

import torch

from psrv.codecs import make as make_codec
from psrv.codecs.push import PushEncoder
from psrv.partition import PartitionPlan
from psrv.protocol import Message

MOMENTUM_SCALE = "l1"  # sign's scale for the momenta under sign_scale auto (the gradients': l2; docs/compression.md)


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

    def take(self, grad: torch.Tensor, lo: int, hi: int, msg: Message) -> torch.Tensor | None:
        """m_i takes the slice [lo, hi) of `grad` (update); past the freeze, the whole flat m_i to push in
        the gradient's place, `msg` marked a momentum; None before it (msg's dense gradient goes as it is)."""
        momentum = self.update(grad, lo, hi)
        if not self.is_momentum(msg.clock):
            return None
        self.mark(msg)
        return momentum

    def mark(self, msg: Message) -> None:
        """Say in push `msg`'s fields that it is a momentum (`momentum`) where its clock is past the freeze."""
        if self.is_momentum(msg.clock):
            msg.fields = {**msg.fields, "momentum": True}

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


def momentum_encoder(plan: PartitionPlan, *, wire_dtype: torch.dtype, encoder: PushEncoder | None, compress: str,
                     sign_scale: str, options: dict) -> tuple[PushEncoder, str]:
    """The push encoder, and its codec's name, of a worker whose shards run onebit_adam: its momenta go in
    `encoder`'s codec, or in scaled sign where it has none (or has sign with sign_scale auto: l1 for momenta,
    MOMENTUM_SCALE); `options`: PushEncoder's. ValueError for a wire_dtype other than float32 (the gradients
    before the freeze go dense, in float32)."""
    if wire_dtype != torch.float32:
        raise ValueError("the shards run onebit_adam, which pushes float32 gradients then codec-compressed "
                         "momenta; remove wire_dtype/float16/bfloat16 compress")
    if encoder is None or (sign_scale == "auto" and compress == "sign"):
        scale = MOMENTUM_SCALE if sign_scale == "auto" else sign_scale
        return PushEncoder(make_codec("sign", sign_scale=scale), plan, **options), "sign"
    return encoder, compress
