"""What the matrix's cases cannot show about SparseLoCo's codec (psrv/codecs/sparseloco.py) and
--error-feedback-decay: the codec against tests/conformance/ref_codecs.py's on vectors with exact (dense) ranges,
a short last chunk and more than one chunk per shard; its bytes; its refusals of malformed parts; a NaN; the pull
direction; the decayed residual over several pushes; and the settings it is refused beside."""
import pytest
import torch

from psrv.codecs import make
from psrv.codecs.push import PushEncoder, decode_push
from psrv.codecs.sparseloco import CHUNK, SparseLoCo, pack, per_chunk, unpack
from psrv.config import ConfigError, RunConfig, from_dict
from psrv.partition import PartitionPlan
from psrv.protocol import ErrorCode, ProtocolError
from tests.conformance.ref_codecs import received

N = 2 * CHUNK + 1500  # two whole chunks and a short one


def vector(seed: int, n: int = N) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def sent(x: torch.Tensor, ratio: float, dense: list[list[int]]) -> torch.Tensor:
    """What a shard decodes for x, dense ranges exact."""
    codec = SparseLoCo(ratio)
    keep = torch.ones(x.numel(), dtype=torch.bool)
    for a, b in dense:
        keep[a:b] = False
    among = keep.nonzero().view(-1) if dense else None
    parts = codec.encode(x, among)
    fields = {"name": codec.name, **codec.params(), "n": x.numel()}
    if dense:
        fields["dense"], parts["dense"] = dense, torch.cat([x[a:b] for a, b in dense])
    return decode_push(fields, parts, x.numel()).densify(torch.empty(x.numel()))


@pytest.mark.parametrize("ratio", [0.01, 0.05, 0.5])
@pytest.mark.parametrize("dense", [[], [[0, 10], [5000, 5100], [N - 7, N]]])
def test_sparseloco_decodes_to_the_references_values(ratio, dense):
    x = vector(1)
    cover = torch.ones(N, dtype=torch.bool)
    for a, b in dense:
        cover[a:b] = False
    want, chosen = received("sparseloco", x, cover, ratio=ratio, draw=None)
    got = sent(x, ratio, dense)
    assert torch.allclose(got, want, atol=1e-6, rtol=0), (got - want).abs().max().item()
    pool = int(cover.sum())
    k = per_chunk(ratio)
    assert chosen.numel() == sum(min(k, pool - s) for s in range(0, pool, CHUNK))
    assert int((got[cover] != 0).sum()) == chosen.numel()  # no zero among the values a random vector's top-k took


def test_sparseloco_sends_two_and_a_quarter_bytes_a_chosen_element():
    parts = SparseLoCo(1 / 64).encode(vector(2, 64 * CHUNK), None)
    chosen = 64 * 64
    assert parts["positions"].dtype == torch.int16 and parts["positions"].numel() == chosen
    assert sum(p.numel() * p.element_size() for p in parts.values()) == 2 * chosen + chosen // 4 + 16
    codes = torch.randint(0, 4, (13,), dtype=torch.uint8)
    assert torch.equal(unpack(pack(codes), 13), codes)


def test_sparseloco_uses_four_values_and_keeps_the_sign_of_large_ones():
    x = vector(3)
    got = sent(x, 0.05, [])
    assert got.unique().numel() <= 5  # 4 table values and the zeros
    big = x.abs() > 3
    assert bool((torch.sign(got[big]) == torch.sign(x[big])).all())


def test_a_malformed_sparseloco_push_is_refused_and_a_nan_fails_the_finite_check():
    codec = SparseLoCo(0.05)
    x = vector(4)
    fields = {"name": codec.name, **codec.params(), "n": N}
    parts = codec.encode(x, None)
    for bent, line in (({**parts, "positions": parts["positions"][:-1]}, "part 'positions' has"),
                       ({**parts, "positions": parts["positions"].int()}, "part 'positions' is int32"),
                       ({**parts, "codes": parts["codes"][:-1]}, "part 'codes' has"),
                       ({**parts, "table": parts["table"][:3]}, "part 'table' has"),
                       ({**parts, "positions": torch.full_like(parts["positions"], 2000)}, "outside their chunk")):
        with pytest.raises(ProtocolError, match=line) as refused:
            decode_push(fields, bent, N)
        assert refused.value.code == ErrorCode.BAD_TENSOR
    for header in ({**fields, "chunk": 1024}, {**fields, "ratio": 2.0}, {**fields, "dense": [[5, "x"]]}):
        with pytest.raises(ProtocolError) as refused:
            decode_push(header, parts, N)
        assert refused.value.code == ErrorCode.BAD_TENSOR
    x[17] = float("nan")
    decoded = decode_push(fields, codec.encode(x, None), N)
    assert not all(bool(torch.isfinite(t).all()) for t in decoded.floats())


def test_a_sparseloco_pull_moves_the_mirror_and_the_copy_alike():
    from psrv.codecs.pull import decode_pull, encode_pull, make_pull_codec
    w, x = vector(5), vector(6)
    fields, parts = encode_pull(make_pull_codec("sparseloco:0.05", seed=0, sign_scale="l1"), x, w, ef=True,
                                dense=[[0, 8]], among=torch.arange(8, N))
    copy = x.clone()
    decode_pull(fields, parts, N).apply_to(copy)
    cover = torch.ones(N, dtype=torch.bool)
    cover[:8] = False
    want = x + received("sparseloco", w - x, cover, ratio=0.05, draw=None)[0]
    want[:8] = w[:8]
    assert torch.allclose(copy, want, atol=1e-6, rtol=0)


def test_the_decayed_residual_is_betas_accumulator():
    """e <- beta e + g; send C(e); e <- e - C(e), over four pushes, against the same written out with the reference's
    codec; beta 1 is plain error feedback."""
    model = torch.nn.Linear(64, 80)  # 5200 parameters, one tensor over the dense limit
    plan = PartitionPlan.from_module(model, 1)
    for beta in (1.0, 0.6):
        enc = PushEncoder(make("sparseloco:0.02"), plan, min_numel=1024, decay=beta)
        e = torch.zeros(plan.total)
        cover = torch.ones(plan.total, dtype=torch.bool)
        cover[64 * 80:] = False  # the weight, then the bias: 80 elements, under the dense limit
        for step in range(4):
            g = vector(10 + step, plan.total)
            fields, parts = enc.encode(g, 0, clock=step)
            enc.settle(0, applied=True)
            x = g + beta * e
            want = received("sparseloco", x, cover, ratio=0.02, draw=None)[0]
            got = decode_push(fields["codec"], parts, plan.total).densify(torch.empty(plan.total))
            assert torch.allclose(got, want, atol=1e-5, rtol=0), (beta, step)  # a table mean: its sum's order
            e = x - got  # the shard's own values: the reference's differ in the last bits, and that would grow
            assert torch.allclose(enc.error, e, atol=1e-6, rtol=0), (beta, step)
            assert fields["codec"]["ratio"] == 0.02  # DGC's warm-up is top-k's and random-k's, not this codec's


def test_the_decay_is_refused_where_no_residual_runs():
    for worker, line in (({"error_feedback_decay": 0.9}, "worker.error_feedback_decay: decays the error feedback"),
                         ({"error_feedback_decay": 0.9, "compress": "topk:0.1", "error_feedback": False},
                          "worker.error_feedback_decay: decays"),
                         ({"compress": "sparseloco:0.02", "compress_warmup": 10}, "worker.compress_warmup")):
        with pytest.raises(ConfigError, match=line):
            from_dict(RunConfig, {"mode": "async", "worker": worker})
    cfg = from_dict(RunConfig, {"mode": "sync", "optimizer": {"name": "sgd", "momentum": 0.0},
                                "worker": {"compress": "sparseloco:0.02", "error_feedback_decay": 0.95,
                                           "local_steps": 4}})
    assert cfg.worker.error_feedback_decay == 0.95


def test_a_push_of_whole_chunks_and_one_all_dense_decode():
    """A shard range of exactly two chunks (no short last one) and one that travels wholly dense (nothing for the
    codec to choose) both decode to the reference's."""
    x = vector(7, 2 * CHUNK)
    want, _ = received("sparseloco", x, torch.ones(2 * CHUNK, dtype=torch.bool), ratio=0.01, draw=None)
    assert torch.allclose(sent(x, 0.01, []), want, atol=1e-6, rtol=0)
    small = vector(8, 40)
    assert torch.equal(sent(small, 0.01, [[0, 40]]), small)  # the dense part alone


def test_two_chosen_values_decode_to_their_mean():
    """The quantiser's step is 6 sigma / 4: for two values, sigma = |v1 - v2| / sqrt 2, and both fall in the middle
    code, whose value is their mean (how coarse 2 bits over 6 sigma is: the reference code's choice)."""
    x = torch.zeros(CHUNK + 10)
    x[5], x[CHUNK + 3] = 5.0, -3.0
    got = sent(x, 1 / CHUNK, [])  # k = 1 a chunk: two chosen
    assert got[5].item() == pytest.approx(1.0) and got[CHUNK + 3].item() == pytest.approx(1.0)
    assert int((got != 0).sum()) == 2


def test_the_header_and_positions_are_checked_with_their_lines():
    codec = SparseLoCo(0.05)
    x = vector(9)
    fields = {"name": codec.name, **codec.params(), "n": N}
    parts = codec.encode(x, None)
    line = r"sparseloco needs chunk 4096 and a ratio in \(0, 1\]; got chunk 4096, ratio "
    for ratio in (0.0, 2.0, 1):
        with pytest.raises(ProtocolError, match=line + repr(ratio)):
            decode_push({**fields, "ratio": ratio}, parts, N)
    whole = SparseLoCo(1.0)
    assert torch.allclose(decode_push({**fields, "ratio": 1.0}, whole.encode(x, None), N).densify(torch.empty(N)),
                          received("sparseloco", x, torch.ones(N, dtype=torch.bool), ratio=1.0, draw=None)[0],
                          atol=1e-6, rtol=0)
    edge = parts["positions"].clone()
    edge[-1] = N - 2 * CHUNK  # the short last chunk's length: one past its end
    with pytest.raises(ProtocolError, match=": sparseloco positions outside their chunk$"):
        decode_push(fields, {**parts, "positions": edge}, N)
    with pytest.raises(ProtocolError, match=r": dense must be a list of \[start, stop\] pairs$"):
        decode_push({**fields, "dense": [[5, "x"]]}, parts, N)


def test_an_empty_selection_quantises_to_a_finite_table():
    """A shard whose every position is in the push's dense ranges chooses nothing: its (unread) table must stay
    finite, or the shard's finiteness check of the push's floats would refuse a finite push."""
    from psrv.codecs.sparseloco import quantise
    codes, table = quantise(torch.empty(0))
    assert codes.numel() == 0 and bool(torch.isfinite(table).all()), table


def test_a_spread_that_overflows_float32_quantises_with_a_step_of_one():
    """Chosen values near 1e18: 6 sigma / 4 overflows float32 (the sum of squares passes 3.4e38), and the step is 1
    (docs/compression.md), as where it is 0: codes by sign then (the values far from their mean), four finite
    values. An infinite step would put every chosen value in the middle code: all one value, their mean."""
    x = vector(4) * 1e18
    cover = torch.ones(N, dtype=torch.bool)
    want, chosen = received("sparseloco", x, cover, ratio=0.05, draw=None)
    got = sent(x, 0.05, [])
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    values = got[chosen].unique()
    assert values.numel() >= 2 and bool((values < 0).any() and (values > 0).any()), values
    # the step's own size: a chosen value about 1 above the mean takes code 3 at a step of 1 (round(0.99 + 2)),
    # code 2 at a step of 2, where it would be received as itself, not as the mean of the +1e19 values' code
    y = torch.tensor([1e19, -1e19] * 8 + [1.0])
    want = received("sparseloco", y, torch.ones(y.numel(), dtype=torch.bool), ratio=1.0, draw=None)[0]
    got = sent(y, 1.0, [])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert got[-1].item() > 1e18, got[-1]


def test_a_value_far_below_the_others_takes_the_lowest_code():
    """19 chosen values of 1 and one of -100: the outlier is 4.2 sigma below the mean, round(c / step + 2) is -1,
    and the clamp puts it in code 0, received as itself. Unclamped, its code wraps in uint8 (255, whose low two
    bits are code 3) and it would be received as the 1s' value (the mutation run's survivor: no other case has a
    chosen value that far below the mean)."""
    y = torch.ones(20)
    y[7] = -100.0
    want = received("sparseloco", y, torch.ones(20, dtype=torch.bool), ratio=1.0, draw=None)[0]
    got = sent(y, 1.0, [])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert got[7].item() == pytest.approx(-100.0) and got[0].item() == pytest.approx(1.0)


def test_a_spread_that_underflows_float32_quantises_with_a_step_of_one():
    """Chosen values near 1e-30: their squares underflow, sigma is 0 though they differ, and the step is 1, as for
    equal values: every value in the middle code, received as their mean. A step of 0 kept would code each by the
    sign of its distance from the mean (an infinite quotient) and receive other values."""
    y = torch.tensor([1e-30, -1e-30, 3e-30])
    want = received("sparseloco", y, torch.ones(3, dtype=torch.bool), ratio=1.0, draw=None)[0]
    got = sent(y, 1.0, [])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert torch.equal(got, torch.full((3,), got[0].item())), got
