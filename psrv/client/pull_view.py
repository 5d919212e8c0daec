"""The worker's side of compressed pulls (`compress_pull`; psrv/codecs/pull.py, psrv/server/pulls/copies.py): its
copy of the weights, which each shard's reply brings up to date, dense or by a compressed change.

The copy is a float32 buffer of the model's size beside the model (local steps move the model's weights
away from what was pulled, so the model cannot hold it): one more copy of the weights in memory. HELLO tells
each shard the codec, error feedback, the resync period and the ranges of small tensors sent exactly;
every pull says which copy this worker holds (the number the shard's last reply gave it, 0: none), so a
shard that lost track (a reply lost on the way, a restart, a re-HELLO) answers dense.

Streaming DiLoCo's fragment pulls (`take_fragment`) bring one fragment's part of the copy up to date: its
elements in this shard, gathered in order, take the change (or the weights, when it comes dense), and go
back to their places in the copy."""
from __future__ import annotations

import torch

from psrv.codec_names import parse
from psrv.codecs.pull import decode_pull
from psrv.codecs.push import dense_ranges
from psrv.partition import PartitionPlan
from psrv.protocol import Message

PULL_SIGN_SCALE = "l1"  # the sign scale a worker asks its shards' sign pulls for: mean |x| shrinks a residual


class PullView:
    """`spec`: the codec (the push's names); `error_feedback`: the shards keep the residual; `resync`: every
    that many pulls one is dense (0: only where a shard lost track); `min_numel`: tensors of fewer elements
    travel exactly; `sign_scale`: sign's (l1 or l2)."""

    def __init__(self, plan: PartitionPlan, spec: str, *, error_feedback: bool, resync: int, min_numel: int,
                 sign_scale: str):
        try:
            parse(spec)
        except ValueError as exc:
            raise ValueError(f"compress_pull {exc}") from None
        if not isinstance(resync, int) or isinstance(resync, bool) or resync < 0:
            raise ValueError(f"pull_resync must be an integer >= 0 (0: only where a shard lost track); got {resync!r}")
        self.spec, self.ranges = spec, plan.ranges
        self._settings = [{"codec": spec, "error_feedback": bool(error_feedback), "resync": resync,
                           "dense": dense_ranges(plan, s, min_numel), "sign_scale": sign_scale}
                          for s in range(plan.num_shards)]
        self.copy = torch.zeros(plan.total, dtype=torch.float32)
        self.numbers = [0] * plan.num_shards
        self.dense_replies = 0       # replies that came dense (first pulls, resyncs, the final pull)
        self.compressed_replies = 0  # replies that came as a change

    def hello_fields(self, shard: int) -> dict:
        """HELLO's `pull` map for `shard`; the shard forgets any copy it knew, so this one is void too."""
        self.numbers[shard] = 0
        return self._settings[shard]

    def request(self, shard: int) -> dict:
        """The fields a pull of `shard` carries: the copy held."""
        return {"view": self.numbers[shard]}

    def take(self, shard: int, reply: Message, out: torch.Tensor) -> None:
        """Shard's reply into the copy and into `out` (its slice of the model's weights; a dense payload may
        already be there, written in place by the transport)."""
        lo, hi = self.ranges[shard]
        mine = self.copy[lo:hi]
        codec = reply.fields.get("pull_codec")
        if codec is None:
            source = reply.tensor if reply.tensor.data_ptr() != out.data_ptr() else out
            mine.copy_(source)
            self.dense_replies += 1
        else:
            if self.numbers[shard] == 0 or reply.fields.get("view") is None:
                raise RuntimeError(f"shard {shard} sent a compressed pull for a copy this worker does not hold")
            decode_pull(codec, reply.parts or {}, hi - lo).apply_to(mine)
            self.compressed_replies += 1
        self.numbers[shard] = int(reply.fields.get("view", 0))
        if reply.tensor is None or reply.tensor.data_ptr() != out.data_ptr():
            out.copy_(mine, non_blocking=out.is_cuda)

    def take_fragment(self, shard: int, reply: Message, pieces: list[tuple[int, int]]) -> torch.Tensor:
        """Shard's reply to a fragment pull into the copy; `pieces`: the fragment's global [start, stop) ranges
        in this shard, in order. Returns the fragment's new values there (a new tensor, gathered's layout)."""
        mine = torch.cat([self.copy[a:b] for a, b in pieces]) if pieces else self.copy[:0].clone()
        codec = reply.fields.get("pull_codec")
        if codec is None:
            if reply.tensor is None or reply.tensor.numel() != mine.numel():
                got = None if reply.tensor is None else reply.tensor.numel()
                raise RuntimeError(f"shard {shard} answered a fragment pull of {mine.numel()} elements with {got}")
            mine.copy_(reply.tensor)
            self.dense_replies += 1
        else:
            if self.numbers[shard] == 0 or reply.fields.get("view") is None:
                raise RuntimeError(f"shard {shard} sent a compressed pull for a copy this worker does not hold")
            decode_pull(codec, reply.parts or {}, mine.numel()).apply_to(mine)
            self.compressed_replies += 1
        self.numbers[shard] = int(reply.fields.get("view", 0))
        at = 0
        for a, b in pieces:
            self.copy[a:b].copy_(mine[at:at + b - a])
            at += b - a
        return mine
