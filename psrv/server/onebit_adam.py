"""1-bit Adam on a parameter server (Tang et al. 2021, "1-bit Adam: Communication Efficient
Large-Scale Training with Adam's Convergence Speed", ICML; DeepSpeed's OnebitAdam), the server's half.

Steps 1..K (K = freeze_step) are torch's Adam on the clock's mean gradient (AdamW's decoupled weight
decay, as DeepSpeed's `update += weight_decay * p`). From step K+1 the variance v is frozen and each
push is a worker's momentum, compressed with error feedback (psrv/client/onebit.py); the shard's mean of the
decoded momenta, masked to 0 where v_K = 0, becomes m, and

    m = mean_i C(m_i + e_i) * [v_K > 0]
    w <- w (1 - lr wd) - lr/(1 - b1^t) * m / (sqrt(v_K)/sqrt(1 - b2^K) + eps)

the Adam step with m's bias correction carried on and v's frozen with v at step K (DeepSpeed's
OnebitAdam has no bias correction at all; with K in the thousands, as DeepSpeed advises, both are 1).

The mask: v_K = 0 exactly where every warm-up gradient was exactly 0 (the weights of an input that is
always 0, a dead unit's). Their true momentum is 0 too, but a scaled sign cannot send 0: it sends the
chunk's mean magnitude s, and over sqrt(v_K) + eps = 1e-8 that is a step of lr * s * 1e8 (digits_mlp
has 823 such weights at K = 100; steps of 743 followed and the run diverged: docs/compression.md).
DeepSpeed's OnebitAdam multiplies the averaged momentum by a user-given `exp_avg_mask` for exactly
these parameters ("1-bit compression cannot represent exact zero", deepspeed/runtime/fp16/onebit/adam.py;
its tutorial's "Momentum masks for parameters with constant zero gradients"); here the mask is read
from v_K itself, so no user has to build one. A weight whose gradient first turns non-zero after the
freeze therefore stays put (Adam with v frozen at 0 would step it by m/eps). The state keeps
torch.optim's layout (step, exp_avg, exp_avg_sq), so it checkpoints like Adam's; the mask is derived
from exp_avg_sq, never stored.

The protocol: WELCOME's `onebit` (`welcome`) tells each worker the freeze step and beta1 it follows, and a
push says whether it is a momentum (field `momentum`, `is_momentum`), which must agree with its clock
(`check_push`).
"""
from __future__ import annotations

import math

import torch

from psrv.config import OptimConfig
from psrv.protocol import ErrorCode, Message, ProtocolError


def frozen_step(state: dict, param: torch.Tensor, momentum: torch.Tensor, *, lr: float, betas: tuple[float, float],
                eps: float, weight_decay: float) -> None:
    """One step after the freeze: `momentum` (the workers' mean), 0 where exp_avg_sq is 0, becomes
    exp_avg; exp_avg_sq stays, bias-corrected by the Adam steps it took (`warmup_steps`, kept in the
    state at the first frozen step: freeze_step, or fewer where a sync clock of the warm-up had no
    finite gradient and so no step)."""
    beta1, beta2 = betas
    warmup = max(1.0, float(state.setdefault("warmup_steps", state["step"].clone())))
    state["step"] += 1
    t = float(state["step"])
    if weight_decay:
        param.mul_(1 - lr * weight_decay)
    state["exp_avg"].copy_(momentum).masked_fill_(state["exp_avg_sq"] == 0, 0.0)
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2 ** warmup)).add_(eps)
    param.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** t))


def is_frozen(state: dict, freeze_step: int) -> bool:
    """True once `freeze_step` Adam steps are in `state` (the next push is a momentum)."""
    return bool(state) and int(state["step"]) >= freeze_step


def welcome(optim: OptimConfig) -> dict | None:
    """What WELCOME tells a worker of onebit_adam (None: another optimizer): its freeze step and beta1."""
    return {"freeze_step": optim.freeze_step, "beta1": optim.betas[0]} if optim.name == "onebit_adam" else None


def is_momentum(msg: Message) -> bool:
    """Whether push `msg` is a worker's momentum (its field `momentum`), not a gradient."""
    return bool(msg.fields.get("momentum"))


def check_push(msg: Message, optim: OptimConfig) -> None:
    """Under onebit_adam a push of clock c < freeze_step is a gradient and a later one a momentum;
    NOT_ALLOWED where the worker disagrees (it did not follow WELCOME's `onebit`), and for a momentum
    under another optimizer."""
    momentum = is_momentum(msg)
    if optim.name != "onebit_adam":
        if momentum:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"a momentum push, but this server runs {optim.name}, "
                                "not onebit_adam")
        return
    if momentum != (msg.clock >= optim.freeze_step):
        want = "momentum" if msg.clock >= optim.freeze_step else "gradient"
        raise ProtocolError(ErrorCode.NOT_ALLOWED, f"onebit_adam with freeze_step {optim.freeze_step}: clock "
                            f"{msg.clock}'s push must be a {want}; the worker must follow WELCOME's onebit")
