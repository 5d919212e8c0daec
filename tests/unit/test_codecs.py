"""Push codecs (psrv/codecs): each encode/decode round trip and the error-feedback accumulation
against a plain reference written here, on known tensors; topk:1.0 is dense bit for bit."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from psrv.codecs import LOSSY, make, parse
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


def ref_sign(x: torch.Tensor, chunk: int, dense: set[int] = frozenset()) -> torch.Tensor:
    """EF-SignSGD's (||x||_1 / d) sign(x) per chunk, ||x||_1 and d over the chunk's elements that are not
    `dense` (those travel exactly and are written over: the reference leaves them as they are)."""
    out = x.clone()
    for a in range(0, len(x), chunk):
        own = [i for i in range(a, min(a + chunk, len(x))) if i not in dense]
        scale = sum(abs(float(x[i])) for i in own) / len(own) if own else 0.0
        for i in own:
            out[i] = scale if float(x[i]) >= 0 else -scale
    return out


def ref_int8(x: torch.Tensor, chunk: int, dense: set[int] = frozenset()) -> torch.Tensor:
    """Absmax quantisation per chunk, the max over the chunk's elements that are not `dense`."""
    out = x.clone()
    for a in range(0, len(x), chunk):
        own = [i for i in range(a, min(a + chunk, len(x))) if i not in dense]
        s = max((abs(float(x[i])) for i in own), default=0.0) / 127 or 1.0
        for i in own:
            out[i] = max(-127, min(127, round(float(x[i]) / s))) * s
    return out


def ref_fp4(x: torch.Tensor, chunk: int, dense: set[int] = frozenset()) -> torch.Tensor:
    """int8's absmax scheme at 4 bits: q = round(x / s) in [-7, 7], s = max |x_i| / 7 per chunk."""
    out = x.clone()
    for a in range(0, len(x), chunk):
        own = [i for i in range(a, min(a + chunk, len(x))) if i not in dense]
        s = max((abs(float(x[i])) for i in own), default=0.0) / 7 or 1.0
        for i in own:
            out[i] = max(-7, min(7, round(float(x[i]) / s))) * s
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


def test_fp4_is_4_bit_absmax_quantisation_per_chunk_two_to_a_byte():
    odd = X[:2499]  # an odd count: the last byte's high nibble is padding
    parts = make("fp4").encode(odd, None)
    assert parts["q"].dtype == torch.uint8 and parts["q"].numel() == 1250
    torch.testing.assert_close(roundtrip("fp4", odd), ref_fp4(odd, 1024), rtol=1e-6, atol=1e-7)
    assert torch.equal(roundtrip("fp4", torch.zeros(9)), torch.zeros(9))


@pytest.mark.parametrize("spec,ref", [("topk:0.05", lambda x: ref_topk(x, 0.05)), ("sign", lambda x: ref_sign(x, 1024)),
                                      ("int8", lambda x: ref_int8(x, 1024)), ("fp4", lambda x: ref_fp4(x, 1024))],
                         ids=["topk", "sign", "int8", "fp4"])
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


@pytest.mark.parametrize("spec", ["sign", "int8"])
def test_a_chunk_scale_leaves_out_the_elements_that_travel_dense(spec):
    """Ten biases of 1.0 travel dense in the chunk of 1014 weights of +-1e-3: the weights' scale is
    theirs alone, so sign sends them as +-1e-3 (not 10x that) and int8 as 1e-3 (not 0)."""
    plan = PartitionPlan((ParamSpec("w", (1014,)), ParamSpec("b", (10,))), 1)
    g = torch.where(torch.randn(1024, generator=GEN) >= 0, 1e-3, -1e-3)
    g[1014:] = 1.0
    fields, parts = PushEncoder(make(spec), plan, error_feedback=False, min_numel=100).encode(g, 0)
    got = decode_push(fields["codec"], parts, 1024).densify(torch.empty(1024))
    assert torch.equal(got[1014:], g[1014:])
    torch.testing.assert_close(got[:1014], g[:1014], rtol=1e-6, atol=0)


@pytest.mark.parametrize("spec,ref", [("sign", ref_sign), ("int8", ref_int8), ("fp4", ref_fp4)],
                         ids=["sign", "int8", "fp4"])
def test_sign_and_int8_scale_each_chunk_over_the_elements_they_cover(spec, ref):
    """Chunks of 16, tensors under 8 elements dense: a dense one inside a chunk, three filling the chunk
    [32, 48) and running into the next, one in the last (partial) chunk; every scale is over the rest."""
    sizes = {"a": 10, "b": 4, "c": 18, "d": 5, "e": 7, "f": 6, "g": 40, "h": 5}
    plan = PartitionPlan(tuple(ParamSpec(k, (n,)) for k, n in sizes.items()), 1)
    starts = dict(zip(sizes, itertools.accumulate([0, *sizes.values()])))
    dense = {i for k, n in sizes.items() if n < 8 for i in range(starts[k], starts[k] + n)}
    assert set(range(32, 48)) <= dense and plan.total == 95
    enc = PushEncoder(LOSSY[spec](chunk=16), plan, error_feedback=False, min_numel=8)
    x = torch.randn(95, generator=GEN) * torch.linspace(0.01, 10, 95)  # the dense ones the largest of their chunk
    fields, parts = enc.encode(x, 0)
    got = decode_push(fields["codec"], parts, 95).densify(torch.empty(95))
    torch.testing.assert_close(got, ref(x, 16, dense), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("spec", ["sign", "int8", "fp4"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_a_nan_or_inf_gives_its_chunk_a_non_finite_scale(spec, bad):
    """Never finite parts for a non-finite input: the shard reads the scales to refuse it."""
    x = X.clone()
    x[1500] = bad  # the second chunk
    codec = make(spec)
    parts = codec.encode(x, None)
    scales = parts["scales"]
    assert torch.isfinite(scales[[0, 2]]).all() and not torch.isfinite(scales[1]), scales
    decoded = decode_push({"name": codec.name, **codec.params(), "n": len(x)}, parts, len(x))
    assert not all(torch.isfinite(t).all() for t in decoded.floats())


@pytest.mark.parametrize("spec", ["sign", "int8", "fp4"])
@pytest.mark.parametrize("at", [500, 1019], ids=["compressed", "dense"])
def test_a_push_with_a_nan_anywhere_is_non_finite(spec, at):
    """Through the worker's encoder: a NaN in the compressed elements shows in a scale, one in a small
    tensor (sent dense) in the dense part; the shard's check sees both."""
    from psrv.server.validate import all_finite

    plan = PartitionPlan((ParamSpec("w", (1014,)), ParamSpec("b", (10,))), 1)
    g = torch.randn(1024, generator=GEN)
    fields, parts = PushEncoder(make(spec), plan, error_feedback=False, min_numel=100).encode(g, 0)
    assert all_finite(decode_push(fields["codec"], parts, 1024))
    g[at] = float("nan")
    fields, parts = PushEncoder(make(spec), plan, error_feedback=False, min_numel=100).encode(g, 0)
    assert not all_finite(decode_push(fields["codec"], parts, 1024))


def test_the_names_and_the_refusals():
    assert parse("topk:0.01") == ("topk", 0.01) and parse("fp16") == ("float16", None)
    for bad in ("topk", "topk:0", "topk:1.5", "randomk:x", "sign:2", "lz4"):
        with pytest.raises(ValueError):
            parse(bad)


def test_the_casts_are_the_wire_dtype_and_a_lossy_codec_goes_alone():
    from psrv.client.psclient import PSClient
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


def test_the_codec_registry_and_the_torch_free_names_list_the_same_codecs():
    """psrv/codec_names.py (read by the config tree without torch) and psrv/codecs' registry are two views
    of one list: a codec added to one alone would be refused by --compress or unknown to the shard."""
    from psrv.codec_names import LOSSY_NAMES
    from psrv.codecs import LOSSY
    assert tuple(LOSSY) == LOSSY_NAMES and all(LOSSY[n].name == n for n in LOSSY)
