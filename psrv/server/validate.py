"""What a request must satisfy before it may touch a shard; each failure is a ProtocolError
that becomes an ERROR reply (a peer can cause it, so it never stops the loop)."""
from __future__ import annotations

import math

import torch

from psrv.codecs import Decoded
from psrv.codecs.push import decode_push
from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import ErrorCode, Message, ProtocolError
from psrv.partition import shard_range
from psrv.server import onebit_adam, velocity

WIRE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class HelloAgain(ProtocolError):
    """The shard does not know this worker (restarted, or dropped it for silence): HELLO again.
    The ERROR reply carries hello=True; PSClient then re-introduces itself and re-sends."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.NOT_ALLOWED, message)


def hello(cfg: ServerConfig, msg: Message) -> tuple[str, int]:
    """(plan_hash, shard size) of a HELLO meant for this shard of this job."""
    f = msg.fields
    if f.get("num_shards") != cfg.num_shards or f.get("shard") != cfg.shard:
        raise ProtocolError(ErrorCode.PLAN_MISMATCH,
                            f"worker addressed shard {f.get('shard')!r} of {f.get('num_shards')!r}; "
                            f"this is shard {cfg.shard} of {cfg.num_shards} (check --servers order)")
    world = cfg.world_size or cfg.workers  # a region's shard serves some of the run's ranks (--first-rank)
    if f.get("world_size") != world:
        raise ProtocolError(ErrorCode.NOT_ALLOWED, f"worker says world size {f.get('world_size')!r}; "
                            f"this server was started with "
                            + (f"--world-size {world}" if cfg.world_size else f"--workers {cfg.workers}"))
    plan_hash, total = f.get("plan_hash"), f.get("total")
    if not isinstance(plan_hash, str) or not isinstance(total, int) or total < cfg.num_shards:
        raise ProtocolError(ErrorCode.MALFORMED, "HELLO needs plan_hash (str) and total (int)")
    lo, hi = shard_range(total, cfg.num_shards, cfg.shard)
    if 0 < cfg.max_message_bytes < 4 * (hi - lo):  # a shard no push could carry: refuse, don't allocate
        raise ProtocolError(ErrorCode.TOO_LARGE, f"a shard of {hi - lo} floats exceeds the server's "
                            f"--max-message-bytes {cfg.max_message_bytes}")
    return plan_hash, hi - lo


def tensor(msg: Message, size: int) -> torch.Tensor:
    t = msg.tensor
    if t is None:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"{msg.type.name} needs a tensor frame")
    if t.dtype not in WIRE_DTYPES or t.numel() != size:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"expected {size} float32 values for this shard, "
                            f"got {t.numel()} {str(t.dtype).removeprefix('torch.')}")
    return t


def push(msg: Message, size: int) -> torch.Tensor | Decoded:
    """A push's gradient: its dense tensor (float32, or the wire dtype), or a compressed push (named
    parts, the codec in fields `codec`) checked against this shard's size (psrv/codecs/push.py); marked
    a velocity (psrv/server/velocity.py) where its fields say `velocity`."""
    if msg.parts is None:
        if "codec" in msg.fields:
            raise ProtocolError(ErrorCode.BAD_TENSOR, "a compressed push (fields codec) needs its parts")
        grad = tensor(msg, size)
    elif "codec" not in msg.fields:
        raise ProtocolError(ErrorCode.BAD_TENSOR, "a push with parts must name its codec (fields codec)")
    else:
        grad = decode_push(msg.fields["codec"], msg.parts, size)
    return velocity.Velocity(grad) if msg.fields.get("velocity") else grad


def inner_steps(msg: Message) -> int:
    """The inner steps a push of local steps covers (`inner_steps`; 1 without it: one step's gradient), checked."""
    value = msg.fields.get("inner_steps", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProtocolError(ErrorCode.MALFORMED, f"inner_steps must be an integer >= 1; got {value!r}")
    return value


def optimizer_welcome(optim: OptimConfig) -> dict:
    """What WELCOME tells a worker of the shards' optimizer, for momentum correction (psrv/server/velocity.py)."""
    return velocity.welcome(optim)


def push_kind(msg: Message, optim: OptimConfig) -> None:
    """A velocity push (momentum correction, psrv/server/velocity.py) or a momentum push (onebit_adam,
    psrv/server/onebit_adam.py check_push) only where the shard's optimizer takes one; NOT_ALLOWED else."""
    velocity.check(msg, optim)
    onebit_adam.check_push(msg, optim)


def all_finite(grad: torch.Tensor | Decoded) -> bool:
    """is_finite of a dense gradient, or of every float part of a compressed one."""
    if isinstance(grad, Decoded):
        return all(is_finite(t) for t in grad.floats() if t.numel())
    return is_finite(grad)


def is_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf anywhere. The sum is the one-pass fast path (a NaN or Inf anywhere makes it
    NaN or Inf; 23x faster than the element-wise check on 64 MB); only a non-finite sum (NaN/Inf,
    or finite values summing past float32's range) pays for the exact element-wise check."""
    if math.isfinite(t.sum(dtype=torch.float32).item()):
        return True
    return bool(torch.isfinite(t).all())
