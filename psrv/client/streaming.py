"""Streaming DiLoCo on the worker (Douillard et al. 2025, arXiv:2501.18512, "Streaming DiLoCo with
overlapping communication"): psrv.Worker's `fragments` F > 1 with `local_steps` H.

Every H/F inner steps the worker pushes one fragment (psrv/client/fragments.py), in turn 0, 1, ..., F-1, 0, ...,
so each fragment is synced once per H inner steps, staggered. The push is fragment f's pseudo-gradient
Δ_f = θ_global,f - θ_local,f (its weights at its last sync minus the model's), as a PUSH_PULL that carries f's
elements only and whose answer is f's new global weights θ'_global,f from the servers' outer step
(psrv/server/fragments.py). It is sent when step() is called and not waited for: the caller's next inner step
runs while it travels (the paper's overlap, τ = 1 inner step). The next step() call first merges the answer,
blocking only if it has not arrived:

    θ_local,f  <- α θ_local,f + (1 - α) θ'_global,f        (α = MIX = 1/2)
    θ_global,f <- θ'_global,f                              (the base of f's next pseudo-gradient)

the paper's mixing (its eq. for overlapped merges), α = 1/2: a plain replacement (α = 0) would throw away
the inner step taken meanwhile, and the paper finds mixing no worse with τ = 1. `outer_dtype` quantises Δ_f
for the wire (bfloat16, or int8 / fp4 with a float32 scale per 1024 elements, psrv/codecs, no error
feedback); the servers dequantise and average in float32.

Under compressed pulls (`compress_pull`, psrv/client/pull_view.py) θ'_global,f comes as the compressed change
of f's weights since this worker's copy of them, with the residual kept on each shard (psrv/server/pulls/copies.py):
θ'_global,f is then f's part of the copy, brought up to date.

A model with NaN or Inf at a fragment push (an inner step on a non-finite gradient) pushes that fragment
marked non-finite (the shards' --nonfinite decides) and restarts every fragment from its weights last synced,
saying so in one log line: else the other fragments' next pushes, and every merge (half NaN), would be NaN too.
"""
from __future__ import annotations

import logging

import torch

from psrv.codecs.fp4 import Fp4
from psrv.codecs.int8 import Int8
from psrv.codecs.push import finite
from psrv.protocol import MsgType
from psrv.client.fragments import Fragments
from psrv.client.roundtrip import Reply, RoundTrip

log = logging.getLogger("psrv.worker")
MIX = 0.5  # α: the local weights' share in a merged fragment
CODECS = {"int8": Int8, "fp4": Fp4}


class StreamingOuter:
    """One worker's fragment pushes: `send(clock)` the next fragment's pseudo-gradient, `merge()` its answer
    into the model (`params`) and the weights last synced (`pulled`), both flat float32 vectors."""

    def __init__(self, client, params: torch.Tensor, pulled: torch.Tensor, fragments: Fragments,
                 outer_dtype: str = "float32", *, norms: list[float] | None = None, pushes: int = 0):
        """`pushes`: the fragment pushes the run made before this worker joined (its first clock): the
        next fragment is that count's, so a rejoiner pushes the fragment the others push at that clock."""
        self.client, self.params, self.pulled, self.fragments = client, params, pulled, fragments
        self.codec = CODECS[outer_dtype]() if outer_dtype in CODECS else None
        self.cast = torch.bfloat16 if outer_dtype == "bfloat16" else None
        self.pushes = pushes  # fragment pushes sent (from the run's start): the next is fragment pushes % F
        self.norms = [] if norms is None else norms  # each push's pseudo-gradient norm, appended
        self._flight: tuple[int, RoundTrip, int | None] | None = None  # fragment, round trip, the pushing step

    @property
    def in_flight(self) -> bool:
        return self._flight is not None

    def send(self, clock: int, *, step: int | None) -> None:
        """Push the next fragment's pseudo-gradient at `clock` and return at once (merge() takes the answer).
        `step`: the step whose row the push is (None: close()'s last push, which has no row)."""
        assert self._flight is None, "a fragment push is in flight: merge() it first"
        frags, f = self.fragments, self.pushes % self.fragments.count
        delta = frags.gather(f, self.pulled).sub_(frags.gather(f, self.params))
        self.norms.append(float(delta.norm()))
        marked = {} if finite(delta) else {"nonfinite": True}  # every shard refuses or drops it alike
        restart = bool(marked) or not finite(self.params)  # NaN or Inf anywhere: every fragment's next push too
        msgs = []
        for s, (a, b) in enumerate(frags.bounds[f]):
            fields = {"fragment": frags.shard_ranges(f, s), **marked, **self.client.pull_fields(s)}
            tensor, parts = delta[a:b].cpu(), None
            if self.codec is not None and b > a:
                parts = {k: v.detach().cpu().contiguous() for k, v in self.codec.encode(tensor, None).items()}
                fields["codec"], tensor = {"name": self.codec.name, **self.codec.params(), "n": b - a}, None
            elif self.cast is not None:
                tensor = tensor.to(self.cast)
            msgs.append(self.client.message(MsgType.PUSH_PULL, clock=clock, base_version=self.client.versions[s],
                                            fields=fields, tensor=tensor, parts=parts))
        self._flight = (f, self.client.send_round(msgs), step)
        self.pushes += 1
        if restart:  # one NaN costs this push alone (docs/compression.md, "A non-finite gradient")
            log.warning("worker %d: the model has NaN or Inf at fragment %d's push (step %s)%s; every fragment "
                        "restarts from its weights last synced", self.client.worker, f, step,
                        ": the push is marked non-finite and the shards' --nonfinite decides" if marked else "")
            self.params.copy_(self.pulled)

    def merge(self) -> tuple[Reply, int | None]:
        """Wait for the fragment in flight's answer and mix it into the model (module docstring); the answer
        and the step that pushed it (send's `step`), whose row its staleness belongs to."""
        (f, rt, step), self._flight = self._flight, None
        reply, replies = self.client.finish_round(rt)
        frags, view = self.fragments, self.client.pull_view
        if view is None:  # a copy: frames may be reused
            fresh = torch.cat([r.tensor.to(self.params.device, torch.float32) for r in replies])
        else:
            fresh = torch.cat([view.take_fragment(s, r, frags.pieces(f, s)) for s, r in enumerate(replies)])
            fresh = fresh.to(self.params.device)
        local = frags.gather(f, self.params).mul_(MIX).add_(fresh, alpha=1 - MIX)
        frags.scatter(f, local, self.params)
        frags.scatter(f, fresh, self.pulled)
        return reply, step
