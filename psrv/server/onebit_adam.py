"""1-bit Adam on a parameter server (Tang et al. 2021, "1-bit Adam: Communication Efficient
Large-Scale Training with Adam's Convergence Speed", ICML; DeepSpeed's OnebitAdam), the server's half.

Steps 1..K (K = freeze_step) are torch's Adam on the clock's mean gradient (AdamW's decoupled weight
decay, as DeepSpeed's `update += weight_decay * p`). From step K+1 the variance v is frozen and each
push is a worker's momentum, compressed with error feedback (psrv/onebit.py); the shard's mean of the
decoded momenta becomes m, and

    w <- w (1 - lr wd) - lr/(1 - b1^t) * m / (sqrt(v_K)/sqrt(1 - b2^K) + eps)

the Adam step with m's bias correction carried on and v's frozen with v at step K (DeepSpeed's
OnebitAdam has no bias correction at all; with K in the thousands, as DeepSpeed advises, both are 1).
The state keeps torch.optim's layout (step, exp_avg, exp_avg_sq), so it checkpoints like Adam's.
"""
from __future__ import annotations

import math

import torch


def frozen_step(state: dict, param: torch.Tensor, momentum: torch.Tensor, *, lr: float, betas: tuple[float, float],
                eps: float, weight_decay: float, freeze_step: int) -> None:
    """One step after the freeze: `momentum` (the workers' mean) becomes exp_avg; exp_avg_sq stays."""
    beta1, beta2 = betas
    state["step"] += 1
    t = float(state["step"])
    if weight_decay:
        param.mul_(1 - lr * weight_decay)
    state["exp_avg"].copy_(momentum)
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2 ** freeze_step)).add_(eps)
    param.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** t))


def is_frozen(state: dict, freeze_step: int) -> bool:
    """True once `freeze_step` Adam steps are in `state` (the next push is a momentum)."""
    return bool(state) and int(state["step"]) >= freeze_step
