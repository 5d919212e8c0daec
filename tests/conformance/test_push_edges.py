"""What no case of the matrix shows about a compressed push's two ends (psrv/codecs/push.py), found by `make mutants`:
the matrix's job has no small tensor that a shard boundary cuts, none of exactly `--compress-min-numel` elements,
and never more than one dense range in a sparse push a sync shard sums; its workers' answers come once each, in
order. The references here are written from the documented rules: a tensor under min_numel elements travels
exactly, top-k sends the k = ceil(ratio n) largest magnitudes of the other positions, and a shard's answer
settles the residual its push left once (applied: the new one; dropped: the old one stays)."""
import math

import pytest
import torch

from psrv.codecs import make
from psrv.codecs.push import PushEncoder, decode_push, dense_ranges, finite
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import ErrorCode, ProtocolError

# Two shards of 74 elements. a1 and a2, the first shard's first tensors, lie side by side; b1 (8 elements) is cut
# by the boundary at 74, 4 on each side; b2 has exactly MIN_NUMEL elements (compressed: "under" min_numel travels
# dense); b3 and b4 lie side by side; the second shard has three dense ranges (a range's values are found by the
# lengths of the ranges before it).
PARAMS = (("a1", 3), ("a2", 2), ("w1", 65), ("b1", 8), ("w2", 28), ("b2", 10), ("b3", 5), ("b4", 2), ("w3", 12),
          ("b5", 3), ("w4", 10))
PLAN = PartitionPlan(tuple(ParamSpec(name, (n,)) for name, n in PARAMS), 2)
MIN_NUMEL = 10


def small_runs(shard: int) -> list[list[int]]:
    """The reference: the shard-relative runs of positions whose tensor has fewer than MIN_NUMEL elements."""
    small = torch.cat([torch.full((n,), n < MIN_NUMEL) for _, n in PARAMS])
    lo, hi = PLAN.ranges[shard]
    runs = []
    for i, s in enumerate(small[lo:hi].tolist()):
        if s and runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        elif s:
            runs.append([i, i + 1])
    return runs


def int8_push(size: int, seed: int) -> tuple[torch.Tensor, dict, dict]:
    """An int8 push of a one-tensor shard of `size` elements: the values, its header and its parts (copies, for a
    case to mangle)."""
    x = torch.randn(size, generator=torch.Generator().manual_seed(seed))
    fields, parts = PushEncoder(make("int8"), PartitionPlan((ParamSpec("w", (size,)),), 1), error_feedback=False
                                ).encode(x, 0)
    return x, dict(fields["codec"]), dict(parts)


def refusal(header, parts: dict, size: int) -> ProtocolError:
    """decode_push's refusal of a push (the case fails where it takes it)."""
    with pytest.raises(ProtocolError) as refused:
        decode_push(header, parts, size)
    return refused.value


def test_the_dense_ranges_are_the_tensors_under_min_numel_where_a_shard_boundary_cuts_them():
    assert PLAN.ranges == ((0, 74), (74, 148))
    assert [dense_ranges(PLAN, s, MIN_NUMEL) for s in range(2)] == [small_runs(0), small_runs(1)] == [
        [[0, 5], [70, 74]], [[0, 4], [42, 49], [61, 64]]]


def test_a_sparse_push_adds_each_dense_range_at_its_place_into_a_sync_shards_sum():
    """WithDense.add_into with a sparse codec (what a sync shard's accumulator takes): the dense values land on
    their own positions range by range, beside top-k's choice among the others."""
    g = torch.randn(PLAN.total, generator=torch.Generator().manual_seed(4))
    enc = PushEncoder(make("topk:0.1"), PLAN, error_feedback=False, min_numel=MIN_NUMEL)
    lo, hi = PLAN.ranges[1]
    fields, parts = enc.encode(g, 1)
    assert fields["codec"]["dense"] == small_runs(1)
    x = g[lo:hi]
    exact = [i for a, b in small_runs(1) for i in range(a, b)]
    among = [i for i in range(hi - lo) if i not in exact]
    top = sorted(among, key=lambda i: -abs(x[i].item()))[:math.ceil(0.1 * len(among))]
    want = torch.full((hi - lo,), 0.5)
    want[exact + top] += x[exact + top]
    accum = torch.full((hi - lo,), 0.5)
    decode_push(fields["codec"], parts, hi - lo).add_into(accum, torch.empty(hi - lo))
    assert torch.equal(accum, want)


def test_finite_values_whose_sum_overflows_float32_are_finite():
    """A worker's slice with NaN or Inf goes raw (psrv/client/push_messages.py); one of huge finite values is
    encoded like any other, though its sum is infinite."""
    assert math.isinf(torch.tensor([3e38, 3e38]).sum().item())
    assert finite(torch.tensor([3e38, 3e38, 1.0]))
    assert not finite(torch.tensor([3e38, float("inf")])) and not finite(torch.tensor([1.0, float("nan")]))


def test_an_answer_settles_its_shards_residual_once_and_forget_gives_up_one_shard_or_all():
    enc = PushEncoder(make("topk:0.1"), PLAN, error_feedback=True)
    gen = torch.Generator().manual_seed(5)

    def push_both() -> list[torch.Tensor]:
        """Each shard's residual if the shard applies this push: x - C(x), x = g + the residual now."""
        g = torch.randn(PLAN.total, generator=gen)
        left = []
        for s, (lo, hi) in enumerate(PLAN.ranges):
            x = g[lo:hi] + enc.error[lo:hi]
            fields, parts = enc.encode(g, s)
            left.append(x - decode_push(fields["codec"], parts, hi - lo).densify(torch.empty(hi - lo)))
        return left

    (lo0, hi0), (lo1, hi1) = PLAN.ranges
    left = push_both()
    assert enc.settle(0, applied=False)  # dropped: the residual stays (zero)
    assert not enc.settle(0, applied=True)  # that push was settled: an answer to it again changes nothing
    assert torch.equal(enc.error[lo0:hi0], torch.zeros(hi0 - lo0))
    assert enc.settle(1, applied=True) and torch.equal(enc.error[lo1:hi1], left[1])
    assert not enc.settle(1, applied=True)

    before = enc.error.clone()
    left = push_both()
    enc.forget(0)  # shard 0's push went raw: its answer settles nothing
    assert not enc.settle(0, applied=True) and torch.equal(enc.error[lo0:hi0], before[lo0:hi0])
    assert enc.settle(1, applied=True) and torch.equal(enc.error[lo1:hi1], left[1])

    before = enc.error.clone()
    push_both()
    enc.forget()  # the push round ended in an error: no answer settles anything
    assert not enc.settle(0, applied=True) and not enc.settle(1, applied=True)
    assert torch.equal(enc.error, before)


def test_the_residual_saved_is_a_copy_and_a_load_takes_it_whole_or_refuses_in_one_line():
    """PushEncoder.state_dict / load_state_dict (a worker's checkpoint, psrv/client/compression_state.py): the
    residual saved does not move with later pushes; loaded, it is the residual, and a push encoded before the load
    settles nothing after it; a residual of another shape, or error feedback on one side only, is refused and
    leaves the residual as it was."""
    enc = PushEncoder(make("topk:0.1"), PLAN, error_feedback=True)
    g = torch.randn(PLAN.total, generator=torch.Generator().manual_seed(6))
    for s in range(2):
        enc.encode(g, s)
        enc.settle(s, applied=True)
    saved = enc.state_dict()
    assert saved.keys() == {"error"} and torch.equal(saved["error"], enc.error) and saved["error"].abs().sum() > 0
    kept = saved["error"].clone()
    enc.encode(g, 0)
    enc.settle(0, applied=True)  # the residual moves on; the saved one does not
    assert torch.equal(saved["error"], kept) and not torch.equal(enc.error, kept)

    enc.encode(g, 1)  # pending when the load comes
    enc.load_state_dict({"error": kept})
    assert torch.equal(enc.error, kept) and enc.error is not kept
    assert not enc.settle(1, applied=True) and torch.equal(enc.error, kept)

    without = PushEncoder(make("topk:0.1"), PLAN, error_feedback=False)
    assert without.state_dict() == {"error": None}
    without.load_state_dict({"error": None})
    for target, state, says in [
            (enc, {"error": None},
             "error-feedback state saved with error feedback off, this worker has it the other way"),
            (without, {"error": kept},
             "error-feedback state saved with error feedback on, this worker has it the other way"),
            (enc, {"error": kept[:-1]}, "error buffer of shape (147,), this model's is (148,)")]:
        before = None if target.error is None else target.error.clone()
        with pytest.raises(ValueError) as refused:
            target.load_state_dict(state)
        assert str(refused.value) == says
        assert (target.error is None) == (before is None) and (before is None or torch.equal(target.error, before))


def test_the_warm_up_raises_the_ratio_of_top_k_and_random_k_only():
    """DGC's warm-up (--compress-warmup, 50 pushes by default whatever the codec) sends top-k's and random-k's
    RATIO^(1/5) at the first push, and leaves SparseLoCo's ratio (and sign's, which has none) as it is."""
    g = torch.randn(PLAN.total, generator=torch.Generator().manual_seed(7))
    for spec, first in [("topk:0.01", 0.01 ** 0.2), ("randomk:0.01", 0.01 ** 0.2), ("sparseloco:0.01", 0.01),
                        ("sign", None)]:
        fields, parts = PushEncoder(make(spec, seed=1), PLAN, warmup=50).encode(g, 1, clock=0)
        assert fields["codec"].get("ratio") == (None if first is None else pytest.approx(first, rel=1e-12)), spec
        if spec.startswith(("topk", "randomk")):
            assert parts["indices"].numel() == math.ceil(first * 74), spec


def test_each_shard_draws_random_k_from_a_stream_of_its_own():
    """Random-k's draws for a shard do not depend on the order the shards are encoded in (overlap sends them in
    the order their gradients are ready), and two shards of one size given the same values draw apart, as do two
    workers (psrv/client/psclient.py seeds a worker's codec with its rank)."""
    same = torch.randn(74, generator=torch.Generator().manual_seed(8)).repeat(2)
    in_order, reversed_ = (PushEncoder(make("randomk:0.2", seed=3), PLAN, error_feedback=False) for _ in range(2))
    first = [in_order.encode(same, s)[1]["indices"] for s in (0, 1)]
    second = [reversed_.encode(same, s)[1]["indices"] for s in (1, 0)][::-1]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not torch.equal(first[0], first[1])
    other_worker = PushEncoder(make("randomk:0.2", seed=4), PLAN, error_feedback=False)  # the seed: the worker's rank
    assert not torch.equal(other_worker.encode(same, 0)[1]["indices"], first[0])


def test_a_push_header_of_up_to_2048_dense_ranges_is_taken_and_one_more_or_not_a_list_is_refused():
    """decode_push checks the header's `dense` before it reads the parts: at most MAX_DENSE_RANGES (2048) sorted
    [start, stop) pairs, covering as many elements as part 'dense' has (BAD_TENSOR in one line otherwise)."""
    size = 2 * 2049
    x, header, parts = int8_push(size, 9)

    def with_ranges(count: int) -> tuple[dict, dict]:
        ranges = [[2 * i, 2 * i + 1] for i in range(count)]  # every other element, exactly
        return ({**header, "dense": ranges}, {**parts, "dense": x[0:2 * count:2].clone()})

    decoded = decode_push(*with_ranges(2048), size)
    assert torch.equal(decoded.densify(torch.empty(size))[0:4096:2], x[0:4096:2])
    for mangled, values, says in [(*with_ranges(2049), "dense must be a list of at most 2048 [start, stop] pairs"),
                                  ({**header, "dense": {"0": 1}}, {**parts, "dense": x[:1].clone()},
                                   "dense must be a list of at most 2048 [start, stop] pairs")]:
        refused = refusal(mangled, values, size)
        assert refused.code is ErrorCode.BAD_TENSOR and str(refused).endswith(says), str(refused)


@pytest.mark.parametrize("ranges,count,says", [
    ([[0, 1, 2]], 1, "dense range [0, 1, 2] is not a sorted, disjoint [start, stop) within [0, 40)"),
    ([["0", 1]], 1, "dense range ['0', 1] is not a sorted, disjoint [start, stop) within [0, 40)"),
    ([[True, 2]], 1, "dense range [True, 2] is not a sorted, disjoint [start, stop) within [0, 40)"),
    ([[3, 3]], 0, "dense range [3, 3] is not a sorted, disjoint [start, stop) within [0, 40)"),
    ([[0, 4], [2, 5]], 7, "dense range [2, 5] is not a sorted, disjoint [start, stop) within [0, 40)"),
    ([[36, 41]], 5, "dense range [36, 41] is not a sorted, disjoint [start, stop) within [0, 40)"),
    ([[0, 4], [6, 8]], 5, "dense ranges cover 6 elements; part 'dense' has 5"),
], ids=["three", "a-string", "a-bool", "empty", "overlapping", "past-the-end", "count"])
def test_a_malformed_dense_range_is_refused_in_its_line(ranges, count, says):
    x, header, parts = int8_push(40, 10)
    refused = refusal({**header, "dense": ranges}, {**parts, "dense": x[:count].clone()}, 40)
    assert refused.code is ErrorCode.BAD_TENSOR and refused.message == says


@pytest.mark.parametrize("header,says", [
    ("topk", "codec must be a map"),
    ({"name": "zip", "n": 40}, "unknown codec 'zip'; this server decodes fp4, int8, randomk, sign, sparseloco, topk"),
    ({"name": ["topk"], "n": 40},
     "unknown codec ['topk']; this server decodes fp4, int8, randomk, sign, sparseloco, topk"),
], ids=["not-a-map", "unknown", "a-list"])
def test_a_push_header_without_a_codec_this_server_decodes_is_malformed_in_its_line(header, says):
    refused = refusal(header, {}, 40)
    assert refused.code is ErrorCode.MALFORMED and refused.message == says


def test_a_cast_or_no_codec_makes_no_lossy_codec():
    """--compress float16 (a cast, which the client makes itself) or none: make returns no codec to encode with."""
    assert [make(spec) for spec in ("", "float16", "fp16", "bfloat16", "bf16")] == [None] * 5
    assert [type(make(spec)).__name__ for spec in ("int8", "fp4", "sign")] == ["Int8", "Fp4", "Sign"]


@pytest.mark.parametrize("mangle,says", [
    (lambda f, p: f.update(n=39), "compressed push for 39 elements; this shard has 40"),
    (lambda f, p: p.update(dense=torch.zeros(2)), "part 'dense' without dense ranges in the header"),
    (lambda f, p: f.update(dense=[[0, 2]]), "dense ranges need a float32 part 'dense'"),
    (lambda f, p: (f.update(dense=[[0, 2]]), p.update(dense=torch.zeros(2, dtype=torch.float16))),
     "dense ranges need a float32 part 'dense'"),
    (lambda f, p: p.pop("scales"), "compressed push lacks its 'scales' part"),
    (lambda f, p: p.update(q=p["q"].to(torch.uint8)), "part 'q' is uint8, expected int8"),
], ids=["size", "dense-part-alone", "ranges-alone", "dense-float16", "no-scales", "q-uint8"])
def test_a_push_whose_parts_disagree_with_its_header_is_refused_in_its_line(mangle, says):
    _, header, parts = int8_push(40, 11)
    mangle(header, parts)
    refused = refusal(header, parts, 40)
    assert refused.code is ErrorCode.BAD_TENSOR and refused.message == says
