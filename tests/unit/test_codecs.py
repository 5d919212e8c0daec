"""Push codecs (psrv/codecs): each encode/decode round trip and the error-feedback accumulation
against a plain reference written here, on known tensors; topk:1.0 is dense bit for bit."""
from __future__ import annotations

import math

import pytest
import torch

from psrv.codecs import make, parse
from psrv.codecs.push import PushEncoder, decode_push
from psrv.partition import ParamSpec, PartitionPlan

GEN = torch.Generator().manual_seed(0)
X = torch.randn(2500, generator=GEN)  # 2500: the last 1024-chunk is partial


def ref_topk(x: torch.Tensor, ratio: float) -> torch.Tensor:
    k = max(1, math.ceil(ratio * len(x)))
    order = sorted(range(len(x)), key=lambda i: -abs(float(x[i])))[:k]
    out = torch.zeros_like(x)
    for i in order:
        out[i] = x[i]
    return out


def ref_sign(x: torch.Tensor, chunk: int) -> torch.Tensor:
    out = torch.empty_like(x)
    for a in range(0, len(x), chunk):
        c = x[a:a + chunk]
        scale = sum(abs(float(v)) for v in c) / len(c)
        out[a:a + chunk] = torch.tensor([scale if float(v) >= 0 else -scale for v in c])
    return out


def ref_int8(x: torch.Tensor, chunk: int) -> torch.Tensor:
    out = torch.empty_like(x)
    for a in range(0, len(x), chunk):
        c = x[a:a + chunk]
        s = max(abs(float(v)) for v in c) / 127 or 1.0
        out[a:a + chunk] = torch.tensor([max(-127, min(127, round(float(v) / s))) * s for v in c])
    return out


def roundtrip(spec: str, x: torch.Tensor) -> torch.Tensor:
    codec = make(spec)
    fields = {"name": codec.name, **codec.params(), "n": len(x)}
    return decode_push(fields, codec.encode(x, None), len(x)).densify(torch.empty(len(x)))


def test_topk_keeps_the_largest_magnitudes():
    assert torch.equal(roundtrip("topk:0.01", X), ref_topk(X, 0.01))
    assert int((roundtrip("topk:0.01", X) != 0).sum()) == 25


def test_topk_one_is_dense_bit_for_bit():
    assert torch.equal(roundtrip("topk:1.0", X), X)


def test_randomk_sends_exact_values_at_k_distinct_places():
    got = roundtrip("randomk:0.1", X)
    kept = got != 0
    assert int(kept.sum()) == 250
    assert torch.equal(got[kept], X[kept])


def test_sign_is_the_scaled_sign_per_chunk():
    assert torch.allclose(roundtrip("sign", X), ref_sign(X, 1024), rtol=1e-6, atol=0)


def test_int8_is_absmax_quantisation_per_chunk():
    assert torch.allclose(roundtrip("int8", X), ref_int8(X, 1024), rtol=1e-6, atol=1e-7)
    zeros = torch.zeros(10)
    assert torch.equal(roundtrip("int8", zeros), zeros)  # degenerate: an all-zero chunk


@pytest.mark.parametrize("spec,ref", [("topk:0.05", lambda x: ref_topk(x, 0.05)), ("sign", lambda x: ref_sign(x, 1024)),
                                      ("int8", lambda x: ref_int8(x, 1024))], ids=["topk", "sign", "int8"])
def test_error_feedback_sends_what_earlier_pushes_left_out(spec, ref):
    """EF-SGD: p_t = C(g_t + e_t), e_{t+1} = g_t + e_t - p_t, over three pushes of one shard."""
    plan = PartitionPlan((ParamSpec("w", (2500,)),), 1)
    enc = PushEncoder(make(spec), plan, error_feedback=True)
    e = torch.zeros(2500)
    for step in range(3):
        g = torch.randn(2500, generator=GEN)
        fields, parts = enc.encode(g, 0)
        assert enc.settle(0, applied=True)  # the shard applied it: its residual is the residual now
        sent = decode_push(fields["codec"], parts, 2500).densify(torch.empty(2500))
        expected = ref(g + e)
        assert torch.allclose(sent, expected, rtol=1e-5, atol=1e-6), step
        e = g + e - expected
        assert torch.allclose(enc.error, e, rtol=1e-5, atol=1e-5)
    assert float(e.abs().sum()) > 0


def test_without_error_feedback_nothing_is_kept():
    plan = PartitionPlan((ParamSpec("w", (2500,)),), 1)
    enc = PushEncoder(make("topk:0.01"), plan, error_feedback=False)
    fields, parts = enc.encode(X, 0)
    assert enc.error is None
    assert torch.equal(decode_push(fields["codec"], parts, 2500).densify(torch.empty(2500)), ref_topk(X, 0.01))


def test_small_tensors_travel_dense_beside_the_codec():
    """compress_min_numel: the bias (10 elements) arrives exactly; top-k picks only among the weight."""
    plan = PartitionPlan((ParamSpec("w", (2000,)), ParamSpec("b", (10,)), ParamSpec("v", (490,))), 2)
    enc = PushEncoder(make("topk:0.01"), plan, error_feedback=True, min_numel=100)
    g = torch.randn(2500, generator=GEN)
    g[2000:2010] = 1e-6  # the smallest of all: top-k alone would never send them
    (lo0, hi0), (lo1, hi1) = plan.ranges
    got = torch.cat([decode_push(f["codec"], p, hi - lo).densify(torch.empty(hi - lo))
                     for f, p, (lo, hi) in [(*enc.encode(g, s), plan.ranges[s]) for s in range(2)]])
    assert torch.equal(got[2000:2010], g[2000:2010])
    assert enc.settle(0, applied=True) and enc.settle(1, applied=True)
    assert torch.equal(enc.error[2000:2010], torch.zeros(10))
    ref = torch.cat([ref_topk(g[:1250], 0.01), ref_topk(torch.cat([g[1250:2000], g[2010:]]), 0.01)])
    assert torch.equal(torch.cat([got[:2000], got[2010:]]), ref)


def test_the_names_and_the_refusals():
    assert parse("topk:0.01") == ("topk", 0.01) and parse("fp16") == ("float16", None)
    for bad in ("topk", "topk:0", "topk:1.5", "randomk:x", "sign:2", "lz4"):
        with pytest.raises(ValueError):
            parse(bad)


def test_the_casts_are_the_wire_dtype_and_a_lossy_codec_goes_alone():
    from psrv.client import PSClient
    from psrv.config import ConfigError, RunConfig, from_dict

    plan = PartitionPlan((ParamSpec("w", (4,)),), 1)
    client = PSClient(["tcp://127.0.0.1:1"], plan, worker=0, world_size=1, heartbeat=False, compress="bf16")
    assert client.wire_dtype == torch.bfloat16 and client.encoder is None
    client.close()
    for kw in ({"compress": "float16", "wire_dtype": "bfloat16"}, {"compress": "sign", "wire_dtype": "float16"}):
        with pytest.raises(ValueError, match="wire_dtype"):
            PSClient(["tcp://127.0.0.1:1"], plan, worker=0, world_size=1, heartbeat=False, **kw)
    with pytest.raises(ConfigError, match="wire_dtype"):
        from_dict(RunConfig, {"worker": {"compress": "topk:0.1", "wire_dtype": "bfloat16"}})
    with pytest.raises(ConfigError, match="compress"):
        from_dict(RunConfig, {"mode": "ddp", "worker": {"compress": "sign"}})
