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
    for codec in (Int8(), Fp4()):
        parts = codec.encode(torch.randn(n), None)
        for name in ("q", "scales"):
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
