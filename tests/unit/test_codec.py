"""The codec pair: every message round-trips, tensors stay zero-copy, defects raise ProtocolError."""
import gc
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import torch

from psrv.protocol import PROTOCOL_VERSION, ErrorCode, Message, MsgType, ProtocolError, decode, encode
from tests.helpers import ROOT


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mtype", [MsgType.PUSH, MsgType.INIT, MsgType.WEIGHTS, MsgType.PUSH_PULL])
def test_tensor_messages_round_trip(mtype, dtype):
    t = torch.randn(1000).to(dtype)
    msg = Message(mtype, worker=3, seq=7, clock=11, base_version=5, fields={"final": True}, tensor=t)
    back = decode([bytes(f) for f in encode(msg)])
    assert (back.type, back.worker, back.seq, back.clock, back.base_version) == (mtype, 3, 7, 11, 5)
    assert back.fields == {"final": True}
    assert back.tensor.dtype == dtype and torch.equal(back.tensor, t)


@pytest.mark.parametrize("mtype", [t for t in MsgType])
def test_header_only_messages_round_trip(mtype):
    back = decode(encode(Message(mtype, worker=1, seq=2, fields={"a": [1, 2], "b": "x"})))
    assert back.type is mtype and back.fields == {"a": [1, 2], "b": "x"} and back.tensor is None


def test_tensor_travels_as_a_raw_frame_without_copy():
    t = torch.arange(10, dtype=torch.float32)
    frames = encode(Message(MsgType.PUSH, tensor=t))
    assert len(frames) == 2 and len(frames[0]) < 200  # the payload is not inside msgpack
    assert torch.frombuffer(frames[1], dtype=torch.float32).data_ptr() == t.data_ptr()
    received = bytearray(frames[1])
    assert decode([frames[0], received]).tensor.data_ptr() == torch.frombuffer(received, dtype=torch.float32).data_ptr()


def test_a_read_only_frame_is_decoded_in_place_and_kept_alive():
    t = torch.randn(4096)
    head, payload = encode(Message(MsgType.PUSH, tensor=t))
    received = bytes(payload)  # read-only, like a zmq frame
    got = decode([head, received]).tensor
    assert got.data_ptr() == np.frombuffer(received, dtype=np.uint8).ctypes.data  # no copy
    del received
    gc.collect()
    junk = [bytes(range(256)) * 64 for _ in range(64)]  # reuse freed memory, were the frame freed
    assert torch.equal(got, t) and junk


def test_the_codec_sets_no_warning_filter_and_decoding_a_read_only_frame_warns_nothing():
    code = """if True:
        import warnings, torch
        before = list(warnings.filters)
        from psrv.protocol import Message, MsgType, decode, encode
        assert list(warnings.filters) == before, "importing the codec changed the warning filters"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            head, payload = encode(Message(MsgType.PUSH, tensor=torch.ones(8)))
            decode([head, bytes(payload)])
        assert not seen, [str(w.message) for w in seen]
    """
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def _header(**over):
    h = {"t": int(MsgType.PUSH), "v": PROTOCOL_VERSION, "w": 0, "s": 1, "c": 0, "bv": 0, "dt": "float32", "n": 16}
    h.update(over)
    return msgpack.packb(h)


@pytest.mark.parametrize("frames, code", [
    ([], ErrorCode.MALFORMED),
    ([b"\xc1\xff garbage"], ErrorCode.MALFORMED),
    ([_header()[:5]], ErrorCode.MALFORMED),                       # truncated header
    ([msgpack.packb([1, 2, 3])], ErrorCode.MALFORMED),             # not a map
    ([_header(v=PROTOCOL_VERSION + 1), bytes(16)], ErrorCode.BAD_VERSION),
    ([_header(t=99), bytes(16)], ErrorCode.UNKNOWN_TYPE),
    ([_header(dt="int64"), bytes(16)], ErrorCode.BAD_TENSOR),
    ([_header(n=12), bytes(16)], ErrorCode.BAD_TENSOR),            # length disagrees with header
    ([_header(n=15), bytes(15)], ErrorCode.BAD_TENSOR),            # not whole float32s
    ([_header()], ErrorCode.BAD_TENSOR),                           # announced tensor missing
    ([_header(s="x"), bytes(16)], ErrorCode.MALFORMED),
    ([_header(), bytes(16), bytes(4)], ErrorCode.MALFORMED),       # too many frames
])
def test_defects_raise_protocol_error(frames, code):
    with pytest.raises(ProtocolError) as info:
        decode(frames)
    assert info.value.code is code
