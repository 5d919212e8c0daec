"""The push messages of PSClient (psrv/client/psclient.py), a mixin of it: a flat gradient cut into one message
per shard, cast to the wire dtype or compressed (through onebit_adam's local momentum, momentum correction's
velocity and the push codec with its error feedback), a slice with NaN or Inf sent raw, and the residuals those
pushes left settled by the shards' answers. Apart from the client because this is the encoding of a push, while
the client is its round trips: hello, pulls, replicas and replies. It reads the client's attributes: ranges,
versions, worker, wire_dtype, encoder, onebit, velocity, and the buffers `_wire` (the gradient in the wire
dtype) and `_at` (the weights the gradient was computed at); and its methods `message` and `pull_fields`."""
from __future__ import annotations

import logging

import torch

from psrv.codecs.push import finite
from psrv.protocol import Message, MsgType

log = logging.getLogger("psrv.client.psclient")


class PushMessages:
    def _pushes(self, mtype: MsgType, grad: torch.Tensor, clock: int, *, cast: bool = True) -> list[Message]:
        """One message per shard with its slice of `grad` in the wire dtype, or compressed. cast=False
        leaves the slices to be filled (cast or encoded) later, shard by shard (`fill_push`)."""
        if self.encoder is not None:  # onebit_adam's warm-up pushes the gradient dense
            self.encoder.forget()  # a push round that failed (an ERROR) settles nothing now
            if self.velocity is not None:
                self.velocity.forget()
            dense = self.onebit is not None and not self.onebit.is_momentum(clock)
            msgs = [self.message(mtype, clock=clock, base_version=self.versions[s], fields=self._pulling(mtype, s),
                                 tensor=grad[lo:hi] if dense else None) for s, (lo, hi) in enumerate(self.ranges)]
            for s, m in enumerate(msgs if cast else []):
                self.fill_push(grad, s, m)
            return msgs
        if grad.dtype != self.wire_dtype:  # one cast into a buffer kept across steps, no allocation
            if self._wire is None or self._wire.shape != grad.shape or self._wire.device != grad.device:
                self._wire = torch.empty_like(grad, dtype=self.wire_dtype)
            grad = self._wire.copy_(grad) if cast else self._wire
        return [self.message(mtype, clock=clock, base_version=self.versions[s], tensor=grad[lo:hi],
                             fields=self._pulling(mtype, s)) for s, (lo, hi) in enumerate(self.ranges)]

    def _pulling(self, mtype: MsgType, shard: int) -> dict:
        return self.pull_fields(shard) if mtype is MsgType.PUSH_PULL else {}

    def fill_push(self, grad: torch.Tensor, shard: int, msg: Message) -> None:
        """Fill shard's push message from `grad` (PushPull's too, shard by shard): its slice of the wire
        buffer (a no-op when grad is already wire dtype), or its compressed parts (the residual they leave
        waits for the shard's answer, `_settle`). Under onebit_adam the local momentum takes the slice
        first, and after the freeze is what is encoded. A slice with NaN or Inf goes raw (`_raw`) and moves
        no worker state."""
        lo, hi = self.ranges[shard]
        if (self.encoder is not None or self.onebit is not None) and not finite(grad[lo:hi]):
            self._raw(grad, shard, msg)
            return
        if self.onebit is not None:
            grad = self.onebit.take(grad, lo, hi, msg)
            if grad is None:
                return  # the dense gradient, already in msg
        if self.velocity is not None:
            grad, msg.fields = self.velocity.direction(grad, self._at, shard), {**msg.fields, "velocity": True}
        if self.encoder is not None:
            codec, msg.parts = self.encoder.encode(grad, shard, msg.clock)
            msg.fields = {**msg.fields, **codec}
            if self.velocity is not None:
                self.velocity.mask(shard, self.encoder.chosen[shard])
        elif grad.dtype != self.wire_dtype:
            self._wire[lo:hi].copy_(grad[lo:hi])

    def _raw(self, grad: torch.Tensor, shard: int, msg: Message) -> None:
        """A non-finite slice, as it is: float32, uncompressed, whole (never in chunks), with the push's
        other fields (onebit_adam's `momentum` where the clock wants it), so the shard's --nonfinite
        policy decides (ERROR NONFINITE, or dropped "nonfinite"). No residual or momentum takes it: one
        NaN would otherwise stay in them and spoil every later push."""
        lo, hi = self.ranges[shard]
        log.warning("worker %d: NaN or Inf in the gradient for shard %d at clock %d; pushed uncompressed, its "
                    "error feedback and momentum left as they were", self.worker, shard, msg.clock)
        msg.tensor, msg.parts = grad[lo:hi].float(), None
        if self.onebit is not None:
            self.onebit.mark(msg)
        if self.velocity is not None:
            msg.fields = {**msg.fields, "velocity": True}
            self.velocity.forget(shard)
        if self.encoder is not None:
            self.encoder.forget(shard)

    def _settle(self, pushes: list[dict]) -> None:
        """Each shard's answer to our push (its push info; a pull's answer has none) settles the residual
        that push left: kept where the push was applied, forgotten where it was dropped."""
        if self.encoder is None:
            return
        for s, p in enumerate(pushes):
            if "version" in p:
                self.encoder.settle(s, applied="dropped" not in p)
                if self.velocity is not None:
                    self.velocity.settle(s, applied="dropped" not in p)
