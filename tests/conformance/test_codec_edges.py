"""What no case of the matrix can show about the sparse codecs, found by `make mutants`: a compressed pull with
exact (dense) ranges has its top-k or random-k choose among the other positions only (psrv/server/pulls/copies.py
`among`), and the matrix's job has no such range. The reference: the k = ceil(ratio n) largest magnitudes
among those positions, picked here by sorting in Python."""
import math
import warnings

import pytest
import torch

from psrv.codecs import make
from psrv.codecs.fp4 import Fp4
from psrv.codecs.int8 import Int8
from psrv.codecs.sparse import warmup_ratio
from psrv.protocol import ProtocolError
from psrv.codecs.randomk import RandomK
from psrv.codecs.scale_blocks import chunk_param
from psrv.codecs.sign import Sign
from psrv.codecs.sparse import count, decode_sparse
from psrv.server.validate import all_finite
from psrv.codecs.topk import TopK

X = torch.randn(100, generator=torch.Generator().manual_seed(3))
AMONG = torch.arange(1, 100, 2)  # the odd positions: the even ones went exactly


def test_topk_among_positions_takes_the_largest_of_those_only():
    parts = TopK(0.1).encode(X, AMONG)
    k = math.ceil(0.1 * len(AMONG))
    want = sorted(sorted(AMONG.tolist(), key=lambda i: -abs(X[i].item()))[:k])
    assert parts["indices"].tolist() == want
    assert torch.equal(parts["values"], X[want])


def test_randomk_among_positions_draws_from_those_only():
    for seed in range(10):  # ten draws: one of 5 positions among 50 is all odd by chance one time in 40
        parts = RandomK(0.1, seed=seed).encode(X, AMONG)
        got = parts["indices"].tolist()
        assert len(got) == math.ceil(0.1 * len(AMONG)) == len(set(got)) and set(got) <= set(AMONG.tolist()), seed
        assert torch.equal(parts["values"], X[got])


def test_a_push_encoded_on_a_device_stays_there_and_decodes_into_the_shards_device():
    """A GPU worker's push is encoded where its gradient is, and a shard decodes CPU parts into its own device's
    buffer. The matrix runs on the CPU, where a `device=` left out changes nothing; the `meta` device stands in
    for the GPU here: a tensor made on the CPU by mistake meets a meta one and raises. Not sign: its scale reads
    a value (`.item()`), which a meta tensor has none of; top-k and random-k decode by checking their indices'
    values, so only their encoding is checked."""
    n = 2051  # two whole chunks of 1024 and one short, an odd count (fp4 pads its last byte)
    for spec in ("int8", "fp4", "topk:0.1", "randomk:0.1"):
        for among in (None, torch.arange(0, n, 3, device="meta")):
            codec = make(spec, seed=0)
            parts = codec.encode(torch.empty(n, device="meta"), among)
            assert {p.device.type for p in parts.values()} == {"meta"}, (spec, among is None)
            if spec in ("int8", "fp4"):
                cpu = type(codec).encode(codec, torch.randn(n), None)
                accum = torch.zeros(n, device="meta")
                type(codec).decode(cpu, codec.params(), n).add_into(accum, torch.empty(n, device="meta"))
                assert accum.device.type == "meta"


def test_int8_and_fp4_scale_each_chunk_over_the_positions_they_cover_only():
    """A push with exact (dense) ranges beside a quantised codec: the dense positions travel apart and are written
    over theirs, so a chunk's scale is max |x| over the positions the codec covers, divided by the codec's levels
    (127, 7). The matrix runs fp4 only as an outer dtype, over every position, so only this can tell."""
    x = torch.randn(40, generator=torch.Generator().manual_seed(5))
    x[0::2] *= 100.0  # the dense (even) positions much larger: a scale taken over them would show
    among = torch.arange(1, 40, 2)
    for codec, levels in ((Int8(chunk=8), 127), (Fp4(chunk=8), 7)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a push's encoding warns nothing (torch resizing an output would)
            parts = codec.encode(x, among)
        want = torch.tensor([max(abs(x[i].item()) for i in range(c, c + 8) if i % 2) / levels for c in range(0, 40, 8)])
        torch.testing.assert_close(parts["scales"], want, rtol=1e-6, atol=0)
        out = type(codec).decode(parts, codec.params(), 40).densify(torch.empty(40))
        q = torch.round(x[among] / want.repeat_interleave(4))
        torch.testing.assert_close(out[among], q * want.repeat_interleave(4), rtol=1e-6, atol=1e-7)
        assert torch.all(out[0::2] == 0)  # the shard writes the dense part over these


def test_a_quantised_push_whose_parts_are_the_wrong_size_is_refused():
    """A malformed push (a part one element short or long) is answered BAD_TENSOR before anything is applied:
    a size the decoder did not check would be read past its end or leave positions unwritten."""
    n = 2051
    for codec in (Int8(), Fp4(), Sign()):
        parts = codec.encode(torch.randn(n), None)
        for name in parts:
            for size in (parts[name].numel() - 1, parts[name].numel() + 1):
                bent = {**parts, name: torch.zeros(size, dtype=parts[name].dtype)}
                with pytest.raises(ProtocolError, match=rf"part '{name}' has {size} elements, expected"):
                    type(codec).decode(bent, codec.params(), n)
    parts = TopK(0.01).encode(torch.randn(n), None)  # a sparse push: as many values as indices
    for size in (parts["values"].numel() - 1, parts["values"].numel() + 1):
        with pytest.raises(ProtocolError, match=rf"part 'values' has {size} elements, expected"):
            TopK.decode({**parts, "values": torch.zeros(size)}, TopK(0.01).params(), n)


def test_dgcs_warm_up_sends_ratio_to_the_stage_over_five_in_four_equal_stages():
    """Lin et al. 2018's warm-up as DGC's code takes it (sparsity 75%, 93.75%, 98.4%, 99.6% for RATIO 0.001): over
    the first N pushes, stage s = clock // (N/4) sends RATIO^((s+1)/5); from push N on, RATIO. The matrix's warm-up
    level (2 pushes) never reaches a later stage's boundary."""
    ratio, pushes = 0.001, 100
    want = {0: 1, 24: 1, 25: 2, 49: 2, 50: 3, 74: 3, 75: 4, 99: 4}
    for clock, stage in want.items():
        assert warmup_ratio(ratio, clock, pushes) == pytest.approx(ratio ** (stage / 5), rel=1e-12), clock
    assert warmup_ratio(ratio, pushes, pushes) == ratio and warmup_ratio(ratio, 500, pushes) == ratio
    assert [round(1 - ratio ** (s / 5), 3) for s in range(1, 5)] == [0.749, 0.937, 0.984, 0.996]  # the paper's


@pytest.mark.parametrize("name, dtype", [("float16", torch.float16), ("bfloat16", torch.bfloat16)])
@pytest.mark.parametrize("ef", [True, False])
def test_a_cast_pull_moves_the_copy_by_the_change_cast_and_its_exact_ranges_to_the_weights(name, dtype, ef):
    """`--compress-pull float16|bfloat16`, which no matrix case runs (its rounding, 2^-11 or 2^-8 of a step's
    change, is under the matrix's tolerance: make mutants found the cast reached by no case). The reference, from
    the definition (docs/compression.md): the copy x moves by the change w - x cast to the dtype and back, and
    with error feedback the exact (dense) ranges take the weights themselves; without it they take their change.
    Parts of another dtype or size are refused."""
    from psrv.codecs.pull import decode_pull, encode_pull, make_pull_codec
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(3000, generator=g), torch.randn(3000, generator=g)
    dense = [[3, 10], [1500, 1512], [2990, 3000]]  # three, none at 0: each range's values are found by offset
    fields, parts = encode_pull(make_pull_codec(name, seed=0, sign_scale="l1"), x, w, ef=ef, dense=dense, among=None)
    copy = x.clone()
    decode_pull(fields, parts, 3000).apply_to(copy)
    want = x + (w - x).to(dtype).float()
    for a, b in dense:
        want[a:b] = w[a:b] if ef else x[a:b] + (w[a:b] - x[a:b])
    assert torch.equal(copy, want)
    assert parts["values"].dtype == dtype and fields["name"] == name and fields["ef"] is ef
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(ProtocolError, match=f"part 'values' is {str(other).removeprefix('torch.')}"):
        decode_pull(fields, {**parts, "values": parts["values"].to(other)}, 3000)
    with pytest.raises(ProtocolError, match="part 'values' has 2999 elements"):
        decode_pull(fields, {**parts, "values": parts["values"][:-1]}, 3000)


def test_a_malformed_pull_header_is_refused_in_its_one_line_with_its_code():
    """A worker refuses a pull whose header is not a map or names no codec it knows (MALFORMED), or whose size
    is not the range's (BAD_TENSOR), each with a line that says which, before anything is applied."""
    from psrv.codecs.pull import decode_pull, encode_pull, make_pull_codec
    from psrv.protocol import ErrorCode
    fields, parts = encode_pull(make_pull_codec("topk:0.1", seed=0, sign_scale="l1"), torch.zeros(50), torch.randn(50),
                                ef=True, dense=[], among=None)
    for header, code, line in (
            (["topk"], ErrorCode.MALFORMED, "pull_codec must be a map"),
            ({**fields, "name": "zstd"}, ErrorCode.MALFORMED, "unknown pull codec 'zstd'"),
            ({**fields, "name": ["topk"]}, ErrorCode.MALFORMED, "unknown pull codec ['topk']"),
            ({**fields, "n": 49}, ErrorCode.BAD_TENSOR, "compressed pull for 49 elements; this range has 50")):
        with pytest.raises(ProtocolError) as refused:
            decode_pull(header, parts, 50)
        assert (refused.value.code, refused.value.message) == (code, line)
    for dense in (None, torch.zeros(3, dtype=torch.float16)):  # exact ranges with no float32 part for them
        bent = {k: v for k, v in parts.items() if k != "dense"} | ({} if dense is None else {"dense": dense})
        with pytest.raises(ProtocolError) as refused:
            decode_pull({**fields, "dense": [[0, 3]]}, bent, 50)
        assert (refused.value.code, refused.value.message) == (
            ErrorCode.BAD_TENSOR, "dense ranges need a float32 part 'dense'")


def test_a_pull_codec_is_the_push_codec_it_names_with_the_shards_seed_and_sign_scale():
    """The shard makes each worker's pull codec with a seed of its own (random-k's draws) and the sign scale
    the worker asked for: both reach the codec (the matrix's pulls are top-k, and sign at l1, the scale workers
    ask for)."""
    from psrv.codecs.pull import make_pull_codec
    x = torch.randn(5000, generator=torch.Generator().manual_seed(11))
    for seed in (7, 8):
        got = make_pull_codec("randomk:0.1", seed=seed, sign_scale="l2").encode(x, None)["indices"]
        assert torch.equal(got, make("randomk:0.1", seed=seed).encode(x, None)["indices"]), seed
    scales = {scale: make_pull_codec("sign", seed=0, sign_scale=scale).encode(x, None)["scales"]
              for scale in ("l1", "l2")}
    for scale, got in scales.items():
        assert torch.equal(got, make("sign", sign_scale=scale).encode(x, None)["scales"]), scale
    assert not torch.equal(scales["l1"], scales["l2"])


@pytest.mark.parametrize("n", [3077, 2048], ids=["ragged", "whole chunks"])
@pytest.mark.parametrize("among", ["all", "every third", "one a chunk"])
@pytest.mark.parametrize("spec, scale", [("sign", "l1"), ("sign", "l2"), ("int8", "l1"), ("fp4", "l1")])
def test_the_dense_codecs_decode_to_the_reference_on_ragged_chunks(spec, scale, among, n):
    """sign (both scales), int8 and fp4 pushed on their own and decoded by the shard, against
    tests/conformance/ref_codecs.py `received` (from the papers' formulas, blocks as a matrix's rows): three whole
    chunks and a short one, zeros (sign's +1) and a chunk of zeros (int8's and fp4's scale 1), with every position
    covered or every third (the others exact). The matrix runs each at one size on whole-tensor pushes: a scale
    taken over the wrong elements of a short chunk, or a sign read off by a bit, is where its tolerance is blind."""
    from tests.conformance.ref_codecs import received
    # ragged: three whole chunks of 1024 and a short one of 5, an odd count (fp4's last byte half used, sign's 5
    # bits); whole chunks: two, the last one's count the chunk's
    x = torch.randn(n, generator=torch.Generator().manual_seed(11)) * torch.linspace(0.1, 3.0, n)
    x[5:40] = 0.0
    x[1024:2048:7] *= -20.0  # a few large ones in the second chunk: its scale is theirs
    x[2048:3072] = 0.0  # a chunk of zeros: sign's scale 0, int8's and fp4's 1
    assert n == 2048 or ((x[3072:] > 0).any() and (x[3072:] < 0).any())  # the short chunk's signs mixed
    cover = {"all": torch.ones(n, dtype=torch.bool), "every third": torch.arange(n) % 3 == 1,
             "one a chunk": torch.isin(torch.arange(n), torch.tensor([7, 1500, 1900, n - 2]))}[among]  # one in the first chunk
    codec = make(spec, sign_scale=scale)
    parts = codec.encode(x, None if among == "all" else cover.nonzero().view(-1))
    got = type(codec).decode(parts, codec.params(), n).densify(torch.empty(n))
    want, _ = received(spec, x, cover, ratio=0.0, draw=None, sign_scale=scale)
    torch.testing.assert_close(got[cover], want[cover], rtol=2e-6, atol=0)
    assert not torch.equal(want, x)  # the codec lost something: the reference is no copy


@pytest.mark.parametrize("spec", ["sign", "int8", "fp4", "topk:0.1"])
def test_a_decoded_push_shows_its_nan_to_the_shards_finiteness_check(spec):
    """What the shard checks for --nonfinite (psrv/server/validate.py all_finite: the decoded push's float parts):
    a NaN among the covered elements reaches it, through the chunk's scale (sign, int8, fp4) or the values
    (top-k)."""
    codec = make(spec)
    x = torch.randn(2051, generator=torch.Generator().manual_seed(2))
    for poisoned in (False, True):
        if poisoned:
            x[1030] = float("nan")
        decoded = type(codec).decode(codec.encode(x, None), codec.params(), x.numel())
        assert all_finite(decoded) is not poisoned, (spec, poisoned)


def test_sign_takes_l1_by_default_and_refuses_another_scale_in_one_line():
    assert Sign().scale == "l1" and Sign(scale="l2").scale == "l2"
    with pytest.raises(ValueError, match=r"^sign's scale must be one of l2, l1; got 'l3'$"):
        Sign(scale="l3")


def test_a_chunk_parameter_is_an_integer_from_1_to_2_to_the_30():
    assert chunk_param({"chunk": 1}) == 1 and chunk_param({"chunk": 1 << 30}) == 1 << 30
    for wrong in (0, (1 << 30) + 1, 1.0, True, None):
        with pytest.raises(ProtocolError, match=rf"^BAD_TENSOR: codec parameter 'chunk' must be an integer in \[1, {1 << 30}\]; "
                                                rf"got {wrong!r}$"):
            chunk_param({"chunk": wrong})


def test_a_sparse_ratio_keeps_the_ceiling_and_at_least_one():
    assert [count(0.01, 50), count(0.3, 10), count(0.31, 10), count(1.0, 7), count(0.5, 0)] == [1, 3, 4, 7, 0]


def test_a_sparse_push_adds_its_values_at_its_indices_and_refuses_one_outside_the_shard():
    """decode_sparse and its scatter-add, against a loop in Python: a repeated index adds its values twice; an
    index below 0 or at n, or more indices than elements, is refused (BAD_TENSOR) in its one line."""
    n = 10
    indices, values = torch.tensor([0, 3, 3, 9], dtype=torch.int32), torch.tensor([1.0, 2.0, 0.5, -4.0])
    decoded = decode_sparse({"indices": indices, "values": values}, {}, n)
    want = torch.zeros(n)
    for i, v in zip(indices.tolist(), values.tolist()):
        want[i] += v
    accum = torch.ones(n)
    decoded.add_into(accum, torch.empty(n))
    assert torch.equal(accum, want + 1) and torch.equal(decoded.densify(torch.full((n,), 7.0)), want)
    refusals = {(-1, 3): r"indices outside \[0, 10\): -1\.\.3$", (0, 10): r"indices outside \[0, 10\): 0\.\.10$",
                (11, 2): r"indices outside \[0, 10\): 2\.\.11$", tuple(range(11)): r"11 indices for a shard of 10 elements$"}
    for wrong, message in refusals.items():
        with pytest.raises(ProtocolError, match="^BAD_TENSOR: " + message):
            decode_sparse({"indices": torch.tensor(wrong, dtype=torch.int32), "values": torch.zeros(len(wrong))}, {}, n)


def test_a_sign_push_decodes_into_a_shard_on_another_device():
    """Sign's decoding off the CPU (unpacked on the CPU, then copied over, the scales moved there too): the meta
    device stands in for the GPU, as in the device test above, where sign's encoding cannot run."""
    n = 2051
    parts = Sign().encode(torch.randn(n), None)
    accum = torch.zeros(n, device="meta")
    Sign.decode(parts, Sign().params(), n).add_into(accum, torch.empty(n, device="meta"))
    assert accum.device.type == "meta"
