"""The one codec pair: Message -> [msgpack header, raw tensor frame], and back.

Tensors travel as raw contiguous buffers (zero copy on both sides), never pickled
and never inside msgpack. Importing or using the codec changes no process-wide state (no warning
filters): a received read-only frame becomes a tensor through a writable alias instead.
"""
from __future__ import annotations

import ctypes

import msgpack
import numpy as np
import torch

from psrv.protocol.messages import PROTOCOL_VERSION, ErrorCode, Message, MsgType, ProtocolError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
PART_DTYPES = {**DTYPES, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8}
PART_DTYPE_NAMES = {v: k for k, v in PART_DTYPES.items()}
MAX_HEADER_BYTES = 64 * 1024
MAX_PARTS = 8
MAX_CLOCK = 2**62  # clocks and versions: far beyond any run, far from the header's 64-bit limit


def encode(msg: Message) -> list:
    """Frames for `msg`: the header, then the tensor's bytes as a buffer (not copied)."""
    header = {"t": int(msg.type), "v": PROTOCOL_VERSION, "w": msg.worker, "s": msg.seq,
              "c": msg.clock, "bv": msg.base_version}
    if msg.session:
        header["sid"] = msg.session
    if msg.fields:
        header["f"] = msg.fields
    if msg.parts:
        bufs = [_cpu(t) for t in msg.parts.values()]
        header["p"] = [[name, PART_DTYPE_NAMES[t.dtype], t.numel() * t.element_size()]
                       for name, t in zip(msg.parts, bufs)]
        return [msgpack.packb(header), *(_buffer(t) for t in bufs)]
    if msg.tensor is None:
        return [msgpack.packb(header)]
    t = _cpu(msg.tensor)
    header["dt"] = DTYPE_NAMES[t.dtype]
    header["n"] = t.numel() * t.element_size()
    return [msgpack.packb(header), _buffer(t)]


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return (t.cpu() if t.device.type != "cpu" else t).contiguous().view(-1)


def _buffer(t: torch.Tensor) -> memoryview:
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: send its bits
        t = t.view(torch.int16)
    return memoryview(t.numpy()).cast("B")


def decode(frames: list) -> Message:
    """Parse frames into a Message; any defect raises ProtocolError (never anything else)."""
    if not frames or len(frames) > 1 + MAX_PARTS:
        raise ProtocolError(ErrorCode.MALFORMED, f"expected 1 to {1 + MAX_PARTS} frames, got {len(frames)}")
    head = memoryview(frames[0])
    if head.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(ErrorCode.MALFORMED, f"header of {head.nbytes} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        h = msgpack.unpackb(head, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for garbage input
        raise ProtocolError(ErrorCode.MALFORMED, f"header is not msgpack: {type(exc).__name__}") from None
    if not isinstance(h, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "header is not a map")
    if h.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.BAD_VERSION, f"protocol version {h.get('v')!r}, this side speaks "
                            f"{PROTOCOL_VERSION}: run one psrv version on every host")
    try:
        mtype = MsgType(h.get("t"))
    except ValueError:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {h.get('t')!r}") from None
    ints = {k: h.get(k, 0) for k in ("w", "s", "c", "bv", "sid")}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints.values()):
        raise ProtocolError(ErrorCode.MALFORMED, "worker, seq, clock, base version and session must be integers")
    if not (0 <= ints["c"] <= MAX_CLOCK and 0 <= ints["bv"] <= MAX_CLOCK):  # a reply says clock + 1: it must fit
        raise ProtocolError(ErrorCode.MALFORMED, f"clock and base version must be in [0, {MAX_CLOCK}]")
    fields = h.get("f", {})
    if not isinstance(fields, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "fields must be a map")
    msg = Message(mtype, ints["w"], ints["s"], ints["c"], ints["bv"], fields, session=ints["sid"])
    if "p" in h:
        msg.parts = _parts(h, frames[1:])
    elif len(frames) > 2:
        raise ProtocolError(ErrorCode.MALFORMED, f"expected 1 or 2 frames, got {len(frames)}")
    elif len(frames) == 2:
        msg.tensor = _tensor(h, frames[1])
    elif "dt" in h:
        raise ProtocolError(ErrorCode.BAD_TENSOR, "header announces a tensor but no tensor frame came")
    return msg


def _parts(h: dict, frames: list) -> dict[str, torch.Tensor]:
    """The named parts `p` = [[name, dtype, bytes], ...] announces, one frame each."""
    spec = h["p"]
    if "dt" in h or not isinstance(spec, list) or len(spec) != len(frames) or not spec:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"header's parts {spec!r} do not match the {len(frames)} "
                            "tensor frame(s) that came (and a message has parts or one tensor, not both)")
    parts = {}
    for entry, frame in zip(spec, frames):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)) or entry[0] in parts:
            raise ProtocolError(ErrorCode.BAD_TENSOR, f"part {entry!r} is not a new [name, dtype, bytes]")
        parts[entry[0]] = _tensor({"dt": entry[1], "n": entry[2]}, frame, PART_DTYPES)
    return parts


def _tensor(h: dict, frame, dtypes: dict = DTYPES) -> torch.Tensor:
    name = h.get("dt")
    dtype = dtypes.get(name) if isinstance(name, str) else None  # any msgpack value may come here
    if dtype is None:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"dtype {h.get('dt')!r} not one of {sorted(dtypes)}")
    buf = memoryview(frame)
    if h.get("n") != buf.nbytes:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"header says {h.get('n')!r} bytes, frame has {buf.nbytes}")
    itemsize = dtype.itemsize
    if buf.nbytes % itemsize:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"{buf.nbytes} bytes is not a whole number of {h['dt']}")
    if buf.nbytes == 0:
        return torch.empty(0, dtype=dtype)
    raw = torch.int16 if dtype == torch.bfloat16 else dtype
    return torch.frombuffer(_writable(buf), dtype=raw).view(dtype)


def _writable(buf: memoryview):
    """`buf`, or for a read-only one (a received zmq frame) a writable alias of the same memory that
    keeps the frame alive: no copy. torch has no read-only tensors and warns (once per process) when
    given a read-only buffer; the tensor is writable either way, and psrv only reads what it receives."""
    if not buf.readonly:
        return buf
    alias = (ctypes.c_ubyte * buf.nbytes).from_address(np.frombuffer(buf, dtype=np.uint8).ctypes.data)
    alias.owner = buf  # the alias does not own its memory: this keeps the frame alive with it
    return alias
