"""The codecs' CPU time measured (experiments/simulate/codec_cost.py's "measured"): each operation is the
real code a run executes, timed on a random vector of the shard's actual size on this machine, the least of
REPEATS timings of the thread's CPU time with torch on one thread (the cost on a core of its own; about a
second in all for an 8.4M-element shard with sign both ways).

The allocator matters: psrv's entry points (psrv serve, worker, run, and psrv simulate, which times these)
tune glibc's malloc to reuse freed big buffers (psrv/process.py tune_malloc). Without that, every fresh
buffer over 32 MiB maps new pages and faults each one in: an 8.4M-element shard's encode or decode then
costs about 2.5 times its CPU time in a real shard or worker (worker push 135 against 55 ms, a shard's
reply 130 against 53 ms, here). A caller from Python times what its own process's allocator gives.

- a worker's push to shard s: PushEncoder.encode with error feedback and its settle (psrv/codecs/push.py),
  or a cast to wire_dtype; streaming DiLoCo: the outer dtype's encode of the fragment (psrv/client/streaming.py);
- a shard's push: the push validated and decoded (psrv/server/validate.py), checked finite and added into the
  clock's sum (Decoded.add_into, as psrv/server/shard.py accumulates); a dense or cast push: nothing (its add is
  dense sync's own work, which no variant is charged);
- a shard's reply with `compress_pull`: PullCopies.answer (or answer_fragment), the encode of the change since
  the worker's copy and the update of its mirror (psrv/server/pulls/copies.py), one per worker;
- a worker's reply: PullView.take (or take_fragment), the decode into its copy (psrv/client/pull_view.py).

One pull in `pull_resync` is dense and charged nothing (a copy); streaming DiLoCo's costs are the average over
its F fragments, one fragment a push, as its bytes are (wire.py). What is left out: the dense optimizer step
(every variant's, dense too), the protocol's framing, and the other processes a machine's cores are shared
with (the CPU a worker's and a shard's codec work take from each other where they run on the same cores)."""
from __future__ import annotations

import math
import time

import torch

from psrv.codecs import make, parse
from psrv.codecs.push import PushEncoder
from psrv.partition import PartitionPlan
from psrv.protocol import Message, MsgType

REPEATS = 5          # timings of each operation; the least is kept
SIGN_SCALE = "l2"    # sign_scale 'auto' outside onebit_adam; the cost does not depend on the rule
CASTS = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def best_of(op, repeats: int = REPEATS, *, before=None) -> float:
    """The least of `repeats` timings of op(), seconds of this thread's CPU (not wall time: on a shared machine
    the time other processes take the core would count): the cost where nothing else takes the core.
    `before()`, untimed, runs ahead of each."""
    least = math.inf
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.thread_time()
        op()
        least = min(least, time.thread_time() - start)
    return least


def measure(worker, plan: PartitionPlan, *, seed: int = 0) -> tuple[tuple[float, ...], ...]:
    """Time the real operations (module docstring) on a random vector of the plan's size: CodecCost's fields
    (worker_push, worker_pull, shard_push, shard_pull), in order."""
    with one_thread():
        vector = random_vector(plan, seed)
        worker_push, shard_push = _push_costs(worker, plan, vector, seed)
        worker_pull, shard_pull = _pull_costs(worker, plan, vector)
    return worker_push, worker_pull, shard_push, shard_pull


def random_vector(plan: PartitionPlan, seed: int) -> torch.Tensor:
    return torch.randn(plan.total, generator=torch.Generator().manual_seed(seed))


class one_thread:
    """torch on one thread while timing (a run's processes share the cores), the setting restored after."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.threads)


def _push_costs(worker, plan: PartitionPlan, grad: torch.Tensor, seed: int) -> tuple[tuple, tuple]:
    shards = plan.num_shards
    codec = make(worker.compress, seed=seed, sign_scale=SIGN_SCALE)
    if codec is None:
        name = parse(worker.compress)[0] if worker.compress else worker.wire_dtype
        if name not in CASTS:
            return (0.0,) * shards, (0.0,) * shards
        return tuple(best_of(lambda: grad[lo:hi].to(CASTS[name])) for lo, hi in plan.ranges), (0.0,) * shards
    # error feedback on, the worker's default (the simulator does not model turning it off)
    encoder = PushEncoder(codec, plan, error_feedback=True, min_numel=worker.compress_min_numel)
    worker_push, shard_push = [], []
    for s, (lo, hi) in enumerate(plan.ranges):
        def encode() -> Message:
            fields, parts = encoder.encode(grad, s)
            encoder.settle(s, applied=True)
            return Message(MsgType.PUSH_PULL, fields=fields, parts=parts)
        worker_push.append(best_of(encode))
        shard_push.append(shard_decode(encode(), hi - lo))
    return tuple(worker_push), tuple(shard_push)


def shard_decode(msg: Message, size: int) -> float:
    """A shard's time for the compressed push `msg` of `size` elements: validated, decoded, checked finite and
    added into the clock's sum."""
    from psrv.server import validate
    accum, scratch = torch.zeros(size), torch.empty(size)

    def take() -> None:
        grad = validate.push(msg, size)
        validate.all_finite(grad)
        grad.add_into(accum, scratch)
    return best_of(take)


def _pull_costs(worker, plan: PartitionPlan, weights: torch.Tensor) -> tuple[tuple, tuple]:
    if not worker.compress_pull:
        return (0.0,) * plan.num_shards, (0.0,) * plan.num_shards
    view = pull_view(worker, plan)
    worker_pull, shard_pull = [], []
    for s, (lo, hi) in enumerate(plan.ranges):
        copies, held = greeted(view, s, weights[lo:hi], hi - lo)
        w, change, out, reply = weights[lo:hi].clone(), 1e-3 * torch.randn(hi - lo), torch.empty(hi - lo), []

        def answer() -> None:
            fields, _, parts, _ = copies.answer(0, w, have=copies.copies[0].number, final=False)
            reply[:] = [Message(MsgType.WEIGHTS, fields=fields, parts=parts)]
        shard_pull.append(best_of(answer, before=lambda: w.add_(change)))  # the weights moved since the last pull
        view.take(s, held, out)
        worker_pull.append(best_of(lambda: view.take(s, reply[0], out)))
    compressed = compressed_share(worker.pull_resync)
    return tuple(c * compressed for c in worker_pull), tuple(c * compressed for c in shard_pull)


def pull_view(worker, plan: PartitionPlan):
    """A worker's PullView of `worker`'s pull settings, no resynchronisation (each timed pull is compressed)."""
    from psrv.client.pull_view import PullView
    return PullView(plan, worker.compress_pull, error_feedback=worker.pull_error_feedback, resync=0,
                    min_numel=worker.compress_min_numel, sign_scale=SIGN_SCALE)


def greeted(view, s: int, weights: torch.Tensor, size: int):
    """Shard s's PullCopies with worker 0 greeted and its first (dense) pull answered: (copies, that reply)."""
    from psrv.server.pulls.copies import PullCopies
    copies = PullCopies(s)
    copies.greet(0, copies.check(0, view.hello_fields(s), size))
    fields, tensor, _, _ = copies.answer(0, weights.clone(), have=0, final=False)
    return copies, Message(MsgType.WEIGHTS, fields=fields, tensor=tensor)


def compressed_share(resync: int) -> float:
    """The share of pulls that come compressed: all but one in `resync` (0: all)."""
    return 1.0 if resync == 0 else (resync - 1) / resync
