"""The update-rule seam: the context of one push, the base rule (`plain`) and the registry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from psrv.config import OptimConfig
    from psrv.server.optim import FlatOptimizer

RULES: dict[str, type["UpdateRule"]] = {}


@dataclass(frozen=True)
class PushContext:
    """What the shard knows of an update before it is applied. `worker` is None for a sync clock's
    mean (its staleness is 0); `staleness` τ = shard.version − base_version, measured before the step."""

    worker: int | None = None
    clock: int = 0
    base_version: int = 0
    staleness: int = 0


SYNC = PushContext()


def register(cls: type["UpdateRule"]) -> type["UpdateRule"]:
    """Class decorator: make the rule available under `cls.name`."""
    RULES[cls.name] = cls
    return cls


@register
class UpdateRule:
    """`plain`: the gradient goes to the optimizer untouched (scale 1), bit for bit as without a rule.

    A rule overrides `prepare`; it must not write into `grad` (it may be a read-only view of the
    received frame) but may write into `out()`, a float32 buffer of the shard's size that it owns for
    this call, made at its first use (it may be `grad` itself when the shard already converted it). Per-worker state is
    kept from `pulled` (called with the weights a worker's pull was answered with) when
    `records_pulls` is set."""

    name = "plain"
    records_pulls = False

    def __init__(self, cfg: "OptimConfig", size: int, device: torch.device):
        self.cfg, self.size, self.device = cfg, size, device

    def prepare(self, grad: torch.Tensor, ctx: PushContext, weights: torch.Tensor,
                out: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
        """(the gradient to step with, the factor the lr was effectively scaled by)."""
        return grad, 1.0

    def step(self, grad: torch.Tensor, optimizer: "FlatOptimizer") -> None:
        """Take the step with the prepared `grad` at `optimizer.lr`: the optimizer's own, for every rule
        but one that keeps its own momentum (dn)."""
        optimizer.step(grad)

    def pulled(self, worker: int, weights: torch.Tensor) -> None:
        """`worker`'s pull was answered with `weights` (the shard's own tensor: copy what you keep)."""

    def counts(self) -> dict[str, int]:
        """What the rule did, for the run's summary (`rule_counts`, summed over a shard's fragments); {} for a
        rule that only scales (its lr scales are counted apart)."""
        return {}

    def state_dict(self) -> dict:
        return {"name": self.name}

    def load_state_dict(self, state: dict) -> None:
        """Take a state_dict of the same rule (the shard skips another rule's: that one starts fresh)."""


def make_rule(cfg: "OptimConfig", size: int, device: torch.device) -> UpdateRule:
    name = getattr(cfg, "update_rule", "plain")
    if name not in RULES:
        raise ValueError(f"unknown update rule {name!r}; use one of {', '.join(RULES)}")
    return RULES[name](cfg, size, device)
