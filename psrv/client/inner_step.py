"""The inner step of local steps (local SGD, DiLoCo) that one non-finite gradient does not poison: the
inner optimizer's state is kept as it was before a step on NaN or Inf (docs/compression.md, "A non-finite
gradient"). The shipped loop (workers/loop.py) steps its inner optimizer through it; a script may too."""
from __future__ import annotations

import copy
import math

import torch


def inner_step(optimizer: torch.optim.Optimizer) -> bool:
    """`optimizer.step()`, except after a gradient with NaN or Inf (any parameter's .grad): the weights take
    the step (so they and the round's pseudo-gradient are non-finite, and psrv.Worker's push carries it to
    the shards' --nonfinite policy, then goes on from the weights it pulls), and the optimizer's state (Adam's
    moments and step count, a momentum buffer) is put back as it was, else every later inner step, and with
    it every later push, would be NaN. Returns whether the gradient was finite."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if _finite(grads):
        optimizer.step()
        return True
    before = copy.deepcopy(optimizer.state_dict())  # only here: a finite step copies nothing
    optimizer.step()
    optimizer.load_state_dict(before)
    return False


def _finite(grads: list[torch.Tensor]) -> bool:
    """No NaN or Inf in `grads`: one sum over them all, and the element-wise check only where the sum is not
    finite (finite values may sum past float32's range)."""
    if not grads or math.isfinite(torch.stack([g.sum(dtype=torch.float32) for g in grads]).sum().item()):
        return True
    return all(bool(torch.isfinite(g).all()) for g in grads)
