"""One shard: a contiguous slice of the flat parameter vector, its optimizer state and version.

The shard decides *how* an update is applied; the consistency controller decides *when*. A velocity
push (momentum correction, psrv/server/velocity.py) is stepped with plain SGD.
"""
from __future__ import annotations

import torch

from psrv.clip import clip_flat_
from psrv.codecs import Decoded
from psrv.config import OptimConfig
from psrv.protocol import ErrorCode, ProtocolError
from psrv.schedule import lr_at
from psrv.server.optim import flat_optimizer
from psrv.server.rules import PushContext, make_rule
from psrv.server.rules.base import SYNC
from psrv.server.velocity import Velocity, mixing


class Shard:
    def __init__(self, size: int, optim: OptimConfig, *, device: str = "cpu", weights: torch.Tensor | None = None):
        """`weights`: the float32 tensor of `size` to keep the weights in (zeroed here), e.g. in shared memory."""
        self.size = size
        self.device = torch.device(device)
        if weights is None:
            weights = torch.empty(size, dtype=torch.float32, device=self.device)
        self.param = torch.nn.Parameter(weights.zero_(), requires_grad=False)
        self.optim_cfg = optim
        self.optimizer = flat_optimizer(optim, self.param)
        self.rule = make_rule(optim, size, self.device)  # optim.update_rule (psrv/server/rules)
        self._accum: torch.Tensor | None = None  # the open clock's sum (sync mode), made at its first use
        self._accumulated = 0
        self._weight = 0  # the sum's weights (each push's 1, or under a quorum its inner steps)
        self._velocity = False  # the open clock's pushes are velocities (momentum correction)
        self._momentum = False  # the open clock's pushes are onebit_adam's momenta (after the freeze)
        self._cast: torch.Tensor | None = None  # a float32 copy of a bf16/fp16 (or off-device) gradient
        self.version = 0          # optimizer steps applied
        self.initialised = False

    @property
    def weights(self) -> torch.Tensor:
        return self.param.data

    @property
    def accumulated(self) -> int:
        """Gradients in the open clock's sum (sync)."""
        return self._accumulated

    def init(self, values: torch.Tensor) -> None:
        self.param.data.copy_(values)
        self.initialised = True

    def apply(self, grad: torch.Tensor | Decoded, ctx: PushContext = SYNC) -> float:
        """One optimizer step with `grad` (asynchronous and SSP pushes), taken in float32, after the
        update rule has seen it with its context; returns the lr scale the rule applied. A compressed
        push is decoded once, into the reused float32 buffer."""
        if isinstance(grad, Decoded):
            return self._step(grad.densify(self._scratch()), ctx, velocity=isinstance(grad, Velocity))
        if grad.dtype != torch.float32 or grad.device != self.device:  # converted into a reused buffer
            grad = self._scratch().copy_(grad)
        return self._step(grad, ctx)

    def apply_slice(self, grad: torch.Tensor, lo: int, hi: int, ctx: PushContext) -> float:
        """One chunk of a push (elements [lo, hi) of this shard): the update rule's prepare and the
        optimizer's step on those elements only, at the lr of this update; `end_slices()` once the push
        is whole counts it (version, optimizer step). Rules and optimizers that take chunks only
        (psrv/server/pushes/chunked.py takes_chunks: their math is element by element, from the push's context)."""
        if grad.dtype != torch.float32 or grad.device != self.device:
            grad = self._scratch()[lo:hi].copy_(grad)
        grad, scale = self.rule.prepare(grad, ctx, self.param.data[lo:hi], lambda: self._scratch()[lo:hi])
        self.optimizer.lr = lr_at(self.optim_cfg, self.version)
        self.optimizer.step_slice(grad, lo, hi)
        return scale

    def end_slices(self) -> None:
        """The chunks of a push are in (or it was given up with some applied): one update."""
        self.optimizer.end_slices()
        self.version += 1

    def pulled(self, worker: int, held: torch.Tensor | None = None) -> None:
        """`worker`'s pull was answered: it now holds `held` (default the weights as they are now; under
        compressed pulls its copy), for rules that keep them."""
        if self.rule.records_pulls:
            self.rule.pulled(worker, self.param.data if held is None else held)

    def _scratch(self) -> torch.Tensor:
        if self._cast is None:
            self._cast = torch.empty(self.size, dtype=torch.float32, device=self.device)
        return self._cast

    def accumulate(self, grad: torch.Tensor | Decoded, *, momentum: bool = False, weight: int = 1) -> None:
        """Add `grad` to the open clock's float32 sum (sync mode), times `weight` (a quorum's merge: the inner
        steps the push covers; the mean divides by their sum); a compressed push straight into it
        (a sparse one by scatter-add). NOT_ALLOWED, nothing added, for a velocity among gradients or
        the other way round, and for a velocity where this shard clips the mean (it needs gradients)."""
        velocity = isinstance(grad, Velocity)
        if self._accumulated and velocity != self._velocity:
            raise mixing(velocity)
        if velocity and self.optim_cfg.clip_grad_norm:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, "a velocity push (momentum correction), but this server "
                                "clips each clock's mean gradient; run the workers with --no-momentum-correction")
        self._velocity, self._momentum = velocity, momentum
        if self._accum is None:
            self._accum = torch.empty(self.size, dtype=torch.float32, device=self.device)
        first = not self._accumulated
        if isinstance(grad, Decoded):
            if first:
                self._accum.zero_()
            if weight == 1:
                grad.add_into(self._accum, self._scratch())
            else:
                self._accum.add_(grad.densify(self._scratch()), alpha=weight)
        elif first and weight == 1:  # the clock's first gradient is the sum: written over the last one, not zeroed
            self._accum.copy_(grad)  # a bf16/fp16 gradient widened element by element, as add_ does
        else:
            if first:
                self._accum.zero_()
            if grad.device != self.device:
                grad = grad.to(self.device)
            self._accum.add_(grad, alpha=weight)  # a bf16/fp16 gradient is widened element by element, not copied
        self._accumulated += 1
        self._weight += weight

    def apply_accumulated(self) -> int:
        """One optimizer step with the mean of the accumulated gradients (sync mode), clipped first to
        the optimizer's clip_grad_norm where it has one (this shard is then the only one: the norm is
        global); returns how many."""
        n = self._accumulated
        assert n > 0 and self._accum is not None, "apply_accumulated with nothing accumulated"
        divisor = float(self._weight)
        if divisor != 1.0 and not self._divides_in_step():
            self._accum.div_(divisor)
            divisor = 1.0
        if self.optim_cfg.clip_grad_norm:
            clip_flat_(self._accum, self.optim_cfg.clip_grad_norm)
        self._step(self._accum, SYNC, velocity=self._velocity, momentum=self._momentum, divisor=divisor)
        self._accumulated = self._weight = 0  # the next clock's first gradient writes over the sum
        return n

    def _divides_in_step(self) -> bool:
        """Whether the mean's division can wait for the optimizer's fused pass (one pass over the shard
        fewer, the same bits): only where nothing reads the mean before the step (no clipping, the plain
        rule, a gradient not a velocity)."""
        return (not self.optim_cfg.clip_grad_norm and self.rule.name == "plain" and not self._velocity
                and self.optimizer.divides())

    def _step(self, grad: torch.Tensor, ctx: PushContext, *, velocity: bool = False,
              momentum: bool | None = None, divisor: float = 1.0) -> float:
        """One optimizer step at the schedule's lr for this update (the version is the update count),
        with the gradient as the update rule prepares it (a velocity: plain SGD; onebit_adam: its frozen
        step where `momentum` says the pushes were momenta, as their clock says, or, None, as its own step
        count says); returns the rule's lr scale."""
        grad, scale = self.rule.prepare(grad, ctx, self.param.data, self._scratch)
        self.optimizer.lr = lr_at(self.optim_cfg, self.version)
        if velocity:
            self.optimizer.plain_step(grad)
        elif divisor != 1.0:  # a sync mean under the plain rule (_divides_in_step): divided in the step's pass
            self.optimizer.step(grad, divisor=divisor)
        elif self.optim_cfg.name == "onebit_adam":
            self.optimizer.step(grad, frozen=momentum)
        else:
            self.rule.step(grad, self.optimizer)  # the optimizer's step, or the rule's own (dn)
        self.version += 1
        return scale

    def discard_accumulated(self) -> int:
        """Forget the open clock's sum (its clock was overtaken after a restore); returns how many
        gradients it held."""
        n, self._accumulated, self._weight = self._accumulated, 0, 0
        return n

    def state_dict(self) -> dict:
        """Parameters, optimizer state (torch.optim's layout), version, the open clock's sum (where it holds a
        gradient) and the update rule's state ("rule": its name and what it keeps; another rule's is not
        loaded, that one starts fresh). Tensors are the shard's own (as nn.Module.state_dict's are): save or
        copy before stepping on."""
        state = {"param": self.param.data, "optimizer": self.optimizer.state_dict(), "version": self.version,
                 "accumulated": self._accumulated, "initialised": self.initialised,
                 "rule": self.rule.state_dict()}
        if self._accumulated:  # else what the buffer holds is no sum (the next gradient writes over it)
            state["accum"] = self._accum
            state["accum_velocity"] = self._velocity
            state["accum_momentum"] = self._momentum
            state["accum_weight"] = self._weight
        return state

    def load_state_dict(self, state: dict) -> None:
        """Take `state` (another shard's state_dict, same size and optimizer); ValueError, with nothing
        changed, if its tensors have another shape."""
        for key in ("param", "accum"):
            if key in state and tuple(state[key].shape) != (self.size,):
                raise ValueError(f"state {key} has shape {tuple(state[key].shape)}, this shard {self.size}")
        for slot in state["optimizer"]["state"].values():  # momentum, Adam moments: one per element
            for name, value in slot.items():
                if torch.is_tensor(value) and value.dim() > 0 and tuple(value.shape) != (self.size,):
                    raise ValueError(f"optimizer state {name} has shape {tuple(value.shape)}, this shard {self.size}")
        rule = make_rule(self.optim_cfg, self.size, self.device)
        if state.get("rule", {}).get("name") == rule.name:  # another rule's state: this one starts fresh
            rule.load_state_dict(state["rule"])
        self.param.data.copy_(state["param"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.rule = rule
        if "accum" in state:
            self._accum = state["accum"].to(self.device, torch.float32).clone()
            self._accumulated = int(state["accumulated"])
            self._weight = int(state.get("accum_weight", self._accumulated))
            self._velocity = bool(state.get("accum_velocity", False))
            self._momentum = bool(state.get("accum_momentum", False))
        else:
            self._accumulated = self._weight = 0
        self.initialised = bool(state.get("initialised", True))
