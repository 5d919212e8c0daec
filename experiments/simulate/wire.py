"""What one push and one reply to each shard weigh on the wire, taken from the real encoders: each message
is built as the worker or the shard builds it (the push codec of psrv/codecs/push.py, the pull codec of
psrv/codecs/pull.py, streaming DiLoCo's fragment push of psrv/client/streaming.py) over a random vector of
the shard's size, once per shard when the model is built, and weighed as the sum of its frames
(psrv/protocol encode), so the model cannot drift from the codecs.

- pushes: float32, or `wire_dtype`'s 2 bytes an element, or `compress`'s parts (tensors under
  `compress_min_numel` dense beside them);
- replies: the shard's range in float32, or with `compress_pull` the average pull: one dense in
  `pull_resync` (0: none), the others compressed with the shard's `pull_error_feedback` setting;
- streaming DiLoCo (`fragments` F, `outer_dtype`): a push of one fragment, as `outer_dtype` encodes it, and
  its reply, that fragment's weights in float32, or with `compress_pull` the average pull of the fragment
  (one dense in `pull_resync` of its own pulls, the others its compressed change, small tensors exact as the
  shard sends them, psrv/server/pulls/copies.py); the fragments differ in size, so each message is the average over
  the F fragments (a push every H/F steps, experiments/simulate/run.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from psrv.client.pull_view import PULL_SIGN_SCALE
from psrv.codecs import make, parse
from psrv.codecs.pull import encode_pull, make_pull_codec
from psrv.codecs.push import PushEncoder, dense_ranges
from psrv.partition import PartitionPlan
from psrv.protocol import Message, MsgType
from psrv.protocol.codec import encode

CASTS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class WireBytes:
    push: tuple[float, ...]    # one push to each shard, bytes
    reply: tuple[float, ...]   # its reply (the pull answered), bytes


def frame_bytes(msg: Message) -> int:
    """The bytes `msg` puts on the wire: its frames as the protocol encodes them."""
    return sum(len(f) if isinstance(f, bytes) else f.nbytes for f in encode(msg))


def wire_bytes(worker, plan: PartitionPlan, *, seed: int = 0) -> WireBytes:
    """The push and reply bytes per shard of a worker with settings `worker` (psrv/config's WorkerSettings)."""
    gen = torch.Generator().manual_seed(seed)
    vector = torch.randn(plan.total, generator=gen)
    if worker.fragments > 1 or worker.outer_dtype != "float32":
        return _streaming(worker, plan, vector)
    return WireBytes(push=_pushes(worker, plan, vector, seed), reply=_replies(worker, plan, vector, seed))


def _pushes(worker, plan: PartitionPlan, grad: torch.Tensor, seed: int) -> tuple[float, ...]:
    codec = make(worker.compress, seed=seed)
    if codec is None:
        dtype = CASTS[parse(worker.compress)[0] if worker.compress else worker.wire_dtype]  # fp16: float16
        return tuple(float(frame_bytes(Message(MsgType.PUSH_PULL, tensor=grad[lo:hi].to(dtype))))
                     for lo, hi in plan.ranges)
    encoder = PushEncoder(codec, plan, error_feedback=False, min_numel=worker.compress_min_numel)
    out = []
    for s in range(plan.num_shards):
        fields, parts = encoder.encode(grad, s)
        out.append(float(frame_bytes(Message(MsgType.PUSH_PULL, fields=fields, parts=parts))))
    return tuple(out)


def _replies(worker, plan: PartitionPlan, weights: torch.Tensor, seed: int) -> tuple[float, ...]:
    dense = [float(frame_bytes(Message(MsgType.WEIGHTS, tensor=weights[lo:hi]))) for lo, hi in plan.ranges]
    if not worker.compress_pull:
        return tuple(dense)
    codec = make_pull_codec(worker.compress_pull, seed=seed, sign_scale=PULL_SIGN_SCALE)
    resync = worker.pull_resync
    out = []
    for s, (lo, hi) in enumerate(plan.ranges):
        ranges = dense_ranges(plan, s, worker.compress_min_numel)
        among = _covered(ranges, hi - lo)
        fields, parts = encode_pull(codec.for_shard(s), torch.zeros(hi - lo), weights[lo:hi],
                                    ef=worker.pull_error_feedback, dense=ranges, among=among)
        compressed = frame_bytes(Message(MsgType.WEIGHTS, fields={"view": 0, "pull_codec": fields}, parts=parts))
        out.append(compressed if resync == 0 else (dense[s] + (resync - 1) * compressed) / resync)
    return tuple(out)


def _covered(ranges: list[list[int]], n: int) -> torch.Tensor | None:
    """The positions a pull codec covers: all but the dense ranges (None: all)."""
    if not ranges:
        return None
    keep = torch.ones(n, dtype=torch.bool)
    for a, b in ranges:
        keep[a:b] = False
    return keep.nonzero().view(-1)


def _streaming(worker, plan: PartitionPlan, vector: torch.Tensor) -> WireBytes:
    from psrv.client.fragments import Fragments
    from psrv.client.streaming import CODECS
    frags = Fragments(plan, worker.fragments)
    codec = CODECS[worker.outer_dtype]() if worker.outer_dtype in CODECS else None
    cast = CASTS.get(worker.outer_dtype, torch.float32)
    push, reply = [0.0] * plan.num_shards, [0.0] * plan.num_shards
    for f in range(frags.count):
        delta = frags.gather(f, vector)
        for s, (a, b) in enumerate(frags.bounds[f]):
            fields, tensor, parts = {"fragment": frags.shard_ranges(f, s)}, delta[a:b], None
            if codec is not None and b > a:
                parts = {k: v.contiguous() for k, v in codec.encode(tensor, None).items()}
                fields["codec"], tensor = {"name": codec.name, **codec.params(), "n": b - a}, None
            else:
                tensor = tensor.to(cast)
            push[s] += frame_bytes(Message(MsgType.PUSH_PULL, fields=fields, tensor=tensor, parts=parts))
            reply[s] += _fragment_reply(worker, plan, frags, f, s, delta[a:b])
    return WireBytes(push=tuple(p / frags.count for p in push), reply=tuple(r / frags.count for r in reply))


def _fragment_reply(worker, plan: PartitionPlan, frags, f: int, s: int, weights: torch.Tensor) -> float:
    """The average reply to a pull of fragment f from shard s (`weights`: its piece there)."""
    from psrv.server.pulls.copies import within
    dense = float(frame_bytes(Message(MsgType.WEIGHTS, tensor=weights)))
    if not worker.compress_pull or not weights.numel():  # a fragment with no piece here: answered dense, empty
        return dense
    codec = make_pull_codec(worker.compress_pull, seed=0, sign_scale=PULL_SIGN_SCALE).for_shard(s)
    ranges = within(dense_ranges(plan, s, worker.compress_min_numel), tuple(map(tuple, frags.shard_ranges(f, s))))
    fields, parts = encode_pull(codec, torch.zeros_like(weights), weights, ef=worker.pull_error_feedback,
                                dense=ranges, among=_covered(ranges, weights.numel()))
    compressed = frame_bytes(Message(MsgType.WEIGHTS, fields={"view": 0, "pull_codec": fields}, parts=parts))
    resync = worker.pull_resync
    return compressed if resync == 0 else (dense + (resync - 1) * compressed) / resync
