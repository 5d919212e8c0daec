"""A worker's compressed-pull settings as its HELLO brings them (psrv/server/pulls/copies.py `_config`, through
PullCopies.check): each malformed field refused with its code and its whole one-line message, nothing kept; a
field left out takes the documented default (resync 0, no dense ranges, sign's l2 scale, error feedback on); a
random-k pull draws from the stream of its worker and shard; and the positions a pull may choose are those
outside the dense ranges, as an element list written here says."""
from __future__ import annotations

import pytest
import torch

from psrv.codecs.pull import make_pull_codec
from psrv.protocol import ErrorCode, ProtocolError
from psrv.server.pulls.copies import MAX_RESYNC, PULL_SEED, PullCopies

SIZE = 100


def refused(fields) -> ProtocolError:
    copies = PullCopies(shard=2)
    with pytest.raises(ProtocolError) as exc:
        copies.check(3, fields, SIZE)
    assert copies.copies == {}
    return exc.value


@pytest.mark.parametrize("fields, code, message", [
    ([], ErrorCode.MALFORMED, "HELLO's pull must be a map"),
    ({"codec": "topk:0.1", "resync": "3"}, ErrorCode.MALFORMED, f"pull resync must be an integer in [0, {MAX_RESYNC}]; got '3'"),
    ({"codec": "topk:0.1", "resync": True}, ErrorCode.MALFORMED, f"pull resync must be an integer in [0, {MAX_RESYNC}]; got True"),
    ({"codec": "topk:0.1", "resync": -1}, ErrorCode.MALFORMED, f"pull resync must be an integer in [0, {MAX_RESYNC}]; got -1"),
    ({"codec": "topk:0.1", "resync": MAX_RESYNC + 1}, ErrorCode.MALFORMED,
     f"pull resync must be an integer in [0, {MAX_RESYNC}]; got {MAX_RESYNC + 1}"),
    ({"codec": "sign", "sign_scale": "l3"}, ErrorCode.MALFORMED, "pull sign_scale must be l1 or l2; got 'l3'"),
    ({"codec": "topk:0.1", "dense": "0-5"}, ErrorCode.MALFORMED, "pull dense must be at most 2048 ranges"),
    ({"codec": "topk:0.1", "dense": [[i, i + 1] for i in range(0, 2 * 2049, 2)]}, ErrorCode.MALFORMED,
     "pull dense must be at most 2048 ranges"),
    ({"codec": "topk:0.1", "dense": [[5, 3]]}, ErrorCode.BAD_TENSOR,
     "dense range [5, 3] is not a sorted, disjoint [start, stop) within [0, 100)"),
    ({"codec": "topk:0.1", "dense": [[0, 5], [90, 101]]}, ErrorCode.BAD_TENSOR,
     "dense range [90, 101] is not a sorted, disjoint [start, stop) within [0, 100)"),
    # ranges that are no pair of integers: refused by the range check, never read as one
    ({"codec": "topk:0.1", "dense": [5]}, ErrorCode.BAD_TENSOR,
     "dense range 5 is not a sorted, disjoint [start, stop) within [0, 100)"),
    ({"codec": "topk:0.1", "dense": [[1, "x"]]}, ErrorCode.BAD_TENSOR,
     "dense range [1, 'x'] is not a sorted, disjoint [start, stop) within [0, 100)"),
    ({"codec": "topk:0.1", "dense": [[1, 2, 3]]}, ErrorCode.BAD_TENSOR,
     "dense range [1, 2, 3] is not a sorted, disjoint [start, stop) within [0, 100)"),
])
def test_a_malformed_field_is_refused_in_one_line(fields, code, message):
    exc = refused(fields)
    assert (exc.code, exc.message) == (code, message)


def test_as_many_dense_ranges_as_allowed_are_kept():
    """2048 ranges, the most a pull may name, are accepted; one more is refused (the table above)."""
    dense = [[i, i + 1] for i in range(0, 2 * 2048, 2)]
    copy = PullCopies(shard=2).check(3, {"codec": "topk:0.1", "dense": dense}, 2 * 2048)
    assert copy.dense == dense and copy.among.tolist() == list(range(1, 2 * 2048, 2))


@pytest.mark.parametrize("spec", ["zip", 5, None])
def test_a_codec_that_is_none_is_refused_with_the_codecs_own_reason(spec):
    exc = refused({"codec": spec})
    with pytest.raises(ValueError) as why:
        make_pull_codec(spec if isinstance(spec, str) else "?", seed=0, sign_scale="l2")
    assert (exc.code, exc.message) == (ErrorCode.MALFORMED, f"pull codec: {why.value}")


def test_a_field_left_out_takes_its_default_and_the_settings_are_kept_as_sent():
    fields = {"codec": "sign"}
    c = PullCopies(shard=2).check(3, fields, SIZE)
    assert (c.resync, c.dense, c.among, c.ef, c.codec.scale) == (0, [], None, True, "l2")
    assert c.fields == fields and c.fields is not fields
    assert (c.ref, c.number, c.since_dense, c.whole, c.known, c.since) == (None, 0, 0, False, set(), {})
    given = {"codec": "sign", "resync": MAX_RESYNC, "sign_scale": "l1", "error_feedback": False,
             "dense": [[0, 10], [40, 45]]}
    c = PullCopies(shard=2).check(3, given, SIZE)
    assert (c.resync, c.dense, c.ef, c.codec.scale) == (MAX_RESYNC, [[0, 10], [40, 45]], False, "l1")
    assert c.among.tolist() == [i for i in range(SIZE) if not (0 <= i < 10 or 40 <= i < 45)]
    assert PullCopies().check(3, None, SIZE) is None  # dense pulls: no settings


def test_a_random_k_pull_draws_from_its_workers_and_shards_own_stream():
    for worker, shard in ((3, 2), (0, 0), (5, 1)):
        c = PullCopies(shard=shard).check(worker, {"codec": "randomk:0.1"}, SIZE)
        expected = torch.Generator().manual_seed((PULL_SEED + worker) * 1_000_003 + shard)
        assert torch.equal(c.codec.generator.get_state(), expected.get_state())


def test_greet_replaces_a_copy_and_forget_drops_it():
    copies = PullCopies(shard=0)
    first = copies.check(1, {"codec": "topk:0.1"}, SIZE)
    copies.greet(1, first)
    assert copies.copies == {1: first}
    second = copies.check(1, {"codec": "topk:0.2"}, SIZE)
    copies.greet(1, second)
    assert copies.copies[1] is second
    copies.greet(1, None)  # a HELLO without pull settings: dense pulls from now on
    assert 1 not in copies.copies
    copies.greet(2, copies.check(2, {"codec": "topk:0.1"}, SIZE))
    copies.forget(2)
    copies.forget(7)  # not known: nothing to drop
    assert copies.copies == {}


def test_a_pull_holding_a_copy_this_shard_has_no_settings_for_asks_for_hello_again():
    """A restarted or resumed shard that the worker did not greet since: the pull holding a copy (`view`) gets
    HelloAgain (NOT_ALLOWED, whose reply makes the client say HELLO and send it again), so it is answered dense
    after, not dense ever after; a pull without a copy, or from a worker with settings, goes on."""
    from psrv.protocol import Message, MsgType
    from psrv.server.validate import HelloAgain
    copies = PullCopies(shard=0)
    copies.greet(1, copies.check(1, {"codec": "topk:0.1"}, SIZE))
    copies.expect(Message(MsgType.PULL, worker=1, fields={"view": 7}))
    copies.expect(Message(MsgType.PULL, worker=4, fields={}))
    with pytest.raises(HelloAgain) as exc:
        copies.expect(Message(MsgType.PULL, worker=4, fields={"view": 7}))
    assert (exc.value.code, exc.value.message) == (
        ErrorCode.NOT_ALLOWED, "worker 4 pulls compressed, but this shard holds no pull settings for it "
                               "(restarted?); send HELLO")


def test_each_shard_life_numbers_its_answers_from_a_random_start():
    """A worker's pull names the copy it holds by the number of the answer that made it; a restarted shard must
    not take that number for one of its own, so each life starts its numbers at random (one in 2^40 alike)."""
    starts = {PullCopies(shard=0)._numbers for _ in range(20)}
    assert len(starts) == 20 and min(starts) >= 1
