"""Momentum correction, the shard's half (the worker's: psrv/client/momentum_correction.py; Lin et al. 2018,
"Deep Gradient Compression"): a push marked `velocity: true` is the worker's SGD velocity, momentum
and weight decay already in it, so the shard steps w <- w - lr * push (a sync clock: their mean) with
plain SGD, no momentum buffer or weight decay of its own. What WELCOME tells the workers
(`optimizer`), the check of such a push against this shard's settings, and the mark the checked push
carries to the shard (`Velocity`)."""
from __future__ import annotations

import torch

from psrv.codecs import Decoded
from psrv.config import OptimConfig
from psrv.config.optimizer import VELOCITY_RULES as FITTING_RULES  # they scale the step; dc-asgd and dn need the raw gradient
from psrv.protocol import ErrorCode, Message, ProtocolError


def welcome(optim: OptimConfig) -> dict:
    """WELCOME's `optimizer`: what a worker needs to keep the velocity the shards would have kept."""
    return {"name": optim.name, "momentum": optim.momentum, "nesterov": optim.nesterov,
            "weight_decay": optim.weight_decay, "update_rule": optim.update_rule}


def check(msg: Message, optim: OptimConfig) -> None:
    """A velocity push needs an sgd shard whose update rule only scales the step; NOT_ALLOWED otherwise."""
    if not msg.fields.get("velocity"):
        return
    if optim.name != "sgd" or optim.update_rule not in FITTING_RULES:
        raise ProtocolError(ErrorCode.NOT_ALLOWED, f"a velocity push (momentum correction), but this server runs "
                            f"{optim.name} with update rule {optim.update_rule}, which need the raw gradient; run "
                            "the workers with --no-momentum-correction")


class Velocity(Decoded):
    """A checked push (dense tensor or compressed) that is a velocity: the shard steps it plainly."""

    def __init__(self, inner: torch.Tensor | Decoded):
        self.inner = inner

    def add_into(self, accum: torch.Tensor, scratch: torch.Tensor) -> None:
        if isinstance(self.inner, Decoded):
            self.inner.add_into(accum, scratch)
        else:
            accum.add_(self.inner.to(accum.device))

    def densify(self, out: torch.Tensor) -> torch.Tensor:
        if isinstance(self.inner, Decoded):
            return self.inner.densify(out)
        return out.copy_(self.inner)

    def floats(self) -> list[torch.Tensor]:
        return self.inner.floats() if isinstance(self.inner, Decoded) else [self.inner]


def mixing(velocity: bool) -> ProtocolError:
    """The error for a sync clock whose pushes are not all of one kind."""
    have, got = ("gradients", "a velocity") if velocity else ("velocities", "a gradient")
    return ProtocolError(ErrorCode.NOT_ALLOWED, f"this clock's pushes so far are {have} and this one is {got}: "
                         "every worker must run with momentum correction, or none (--no-momentum-correction)")
