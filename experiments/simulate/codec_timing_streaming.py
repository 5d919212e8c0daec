"""Streaming DiLoCo's codec cost (experiments/simulate/codec_timing.py): per fragment push, the worker's encode
of the fragment's pseudo-gradient as `outer_dtype` (psrv/client/streaming.py: int8 and fp4 encode, bfloat16
casts, float32 sends it as it is) and the shard's decode of it; with `compress_pull`, the shard's answer to a
fragment pull (PullCopies.answer_fragment) and the worker's take of it (PullView.take_fragment). Each is the
average over the F fragments, as a push carries one of them in turn."""
from __future__ import annotations

import torch

from psrv.experiments.simulate.codec_timing import (best_of, compressed_share, greeted, one_thread, pull_view,
                                                    random_vector, shard_decode)
from psrv.partition import PartitionPlan
from psrv.protocol import Message, MsgType


def measure_streaming(worker, plan: PartitionPlan, *, seed: int = 0) -> tuple[tuple[float, ...], ...]:
    """CodecCost's fields (worker_push, worker_pull, shard_push, shard_pull) of one fragment push, averaged."""
    with one_thread():
        return _streaming_cost(worker, plan, random_vector(plan, seed))


def _streaming_cost(worker, plan: PartitionPlan, vector: torch.Tensor) -> tuple[tuple[float, ...], ...]:
    from psrv.client.fragments import Fragments
    from psrv.client.streaming import CODECS
    frags = Fragments(plan, worker.fragments)
    codec = CODECS[worker.outer_dtype]() if worker.outer_dtype in CODECS else None
    cast = torch.bfloat16 if worker.outer_dtype == "bfloat16" else None
    shards = plan.num_shards
    worker_push, shard_push = [0.0] * shards, [0.0] * shards
    worker_pull, shard_pull = [0.0] * shards, [0.0] * shards
    view = pull_view(worker, plan) if worker.compress_pull else None
    pulls = [greeted(view, s, vector[lo:hi], hi - lo) for s, (lo, hi) in enumerate(plan.ranges)] if view else []
    for s, (copies, held) in enumerate(pulls):  # the worker holds each shard's whole copy
        view.take(s, held, torch.empty(held.tensor.numel()))
    for f in range(frags.count):
        delta = frags.gather(f, vector)
        for s, (a, b) in enumerate(frags.bounds[f]):
            if b <= a:  # the fragment has no piece in this shard
                continue
            tensor = delta[a:b]
            if codec is not None:
                def encode() -> Message:
                    parts = {k: v.detach().cpu().contiguous() for k, v in codec.encode(tensor, None).items()}
                    fields = {"fragment": frags.shard_ranges(f, s),
                              "codec": {"name": codec.name, **codec.params(), "n": b - a}}
                    return Message(MsgType.PUSH_PULL, fields=fields, parts=parts)
                worker_push[s] += best_of(encode)
                shard_push[s] += shard_decode(encode(), b - a)
            elif cast is not None:
                worker_push[s] += best_of(lambda: tensor.to(cast))
            if view is not None:
                shard, took = _fragment_pull(view, pulls[s][0], frags, f, s, vector[slice(*plan.ranges[s])])
                shard_pull[s] += shard
                worker_pull[s] += took
    share = compressed_share(worker.pull_resync)
    return (tuple(c / frags.count for c in worker_push), tuple(share * c / frags.count for c in worker_pull),
            tuple(c / frags.count for c in shard_push), tuple(share * c / frags.count for c in shard_pull))


def _fragment_pull(view, copies, frags, f: int, s: int, weights: torch.Tensor) -> tuple[float, float]:
    """(the shard's, the worker's) seconds for one compressed pull of fragment f from shard s."""
    key = tuple(tuple(r) for r in frags.shard_ranges(f, s))
    w, change, reply = weights.clone(), 1e-3 * torch.randn(weights.numel()), []

    def answer() -> None:
        fields, _, parts = copies.answer_fragment(0, w, key, have=copies.copies[0].number, final=False)
        reply[:] = [Message(MsgType.WEIGHTS, fields=fields, parts=parts)]
    shard = best_of(answer, before=lambda: w.add_(change))  # the weights moved since the last pull
    pieces = frags.pieces(f, s)
    return shard, best_of(lambda: view.take_fragment(s, reply[0], pieces))
