"""Compressed pulls of streaming DiLoCo's fragments, both ends without a network (psrv/server/pulls/copies.py
`answer_fragment`, psrv/client/pull_view.py `take_fragment`): a fragment pull brings only that fragment's part
of the copy up to date, the shard's mirror and the worker's copy stay equal bit for bit, top-k at ratio 1 is
a dense pull, small tensors travel exactly; a lost reply, a HELLO and each fragment's own resync period come
dense; a backup given the copies' state answers the next pull alike."""
from __future__ import annotations

import pytest
import torch

from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import Message, MsgType, decode, encode
from psrv.server.pulls.copies import PullCopies, within
from psrv.client.fragments import Fragments
from psrv.client.pull_view import PullView
from tests.helpers import weight_walk

# tensors of 1500, 8, 1200, 900 and 6 elements in two shards; the 8 and 6 travel exactly (min_numel 100)
PLAN = PartitionPlan(tuple(ParamSpec(n, (k,)) for n, k in zip("abcde", (1500, 8, 1200, 900, 6))), 2)
FRAGS = Fragments(PLAN, 2)  # fragment 0: a, c, e; fragment 1: b, d
N = PLAN.total


class Pair:
    """Each shard's PullCopies and the worker's PullView, talking through the wire format."""

    def __init__(self, spec: str, *, ef: bool = True, resync: int = 0):
        self.view = PullView(PLAN, spec, error_feedback=ef, resync=resync, min_numel=100, sign_scale="l1")
        self.shards = [PullCopies(s) for s in range(PLAN.num_shards)]
        for s, copies in enumerate(self.shards):
            copies.greet(0, copies.check(0, self.view.hello_fields(s), PLAN.ranges[s][1] - PLAN.ranges[s][0]))

    def whole(self, w: torch.Tensor, *, final: bool = False) -> torch.Tensor:
        out = torch.empty(N)
        for s, (lo, hi) in enumerate(PLAN.ranges):
            have = self.view.request(s)["view"]
            fields, tensor, parts, _ = self.shards[s].answer(0, w[lo:hi], have=have, final=final)
            self.view.take(s, _wire(fields, tensor, parts), out[lo:hi])
        return out

    def fragment(self, f: int, w: torch.Tensor, lose: int | None = None) -> torch.Tensor:
        """Fragment f's pull from every shard (shard `lose`'s reply lost on the way); its new values."""
        got = []
        for s, (lo, hi) in enumerate(PLAN.ranges):
            key = tuple(tuple(r) for r in FRAGS.shard_ranges(f, s))
            fields, tensor, parts = self.shards[s].answer_fragment(0, w[lo:hi], key, have=self.view.request(s)["view"],
                                                                   final=False)
            if s != lose:
                got.append(self.view.take_fragment(s, _wire(fields, tensor, parts), FRAGS.pieces(f, s)))
        return torch.cat(got)

    def mirror(self) -> torch.Tensor:
        return torch.cat([c.copies[0].ref for c in self.shards])


def _wire(fields, tensor, parts) -> Message:
    return decode(encode(Message(MsgType.WEIGHTS, fields=fields, tensor=tensor, parts=parts)))


def _walk(steps: int, seed: int = 0):
    return weight_walk(N, steps, seed)


@pytest.mark.parametrize("spec", ["sign", "topk:0.05", "int8"])
def test_a_fragment_pull_moves_that_fragments_part_of_the_copy_only_and_the_copies_stay_equal(spec):
    pair = Pair(spec)
    walk = _walk(7)
    pair.whole(next(walk))
    for i, w in enumerate(walk):
        f = i % 2
        before = pair.view.copy.clone()
        fresh = pair.fragment(f, w)
        other = FRAGS.gather(1 - f, pair.view.copy)
        assert torch.equal(other, FRAGS.gather(1 - f, before))  # the other fragment's part untouched
        assert torch.equal(fresh, FRAGS.gather(f, pair.view.copy))
        assert torch.equal(pair.view.copy, pair.mirror())  # bit for bit, both ends
        a, b = (N - 6, N) if f == 0 else (1500, 1508)  # e, b: small, so pulled as the weights themselves
        assert torch.equal(pair.view.copy[a:b], w[a:b])
        residual = (FRAGS.gather(f, w) - fresh).abs().max()
        assert 0 < residual < 1.0  # compressed, and the residual is bounded
    assert pair.view.dense_replies == 2 and pair.view.compressed_replies == 12  # 2 shards x 6 fragment pulls


def test_topk_at_ratio_one_is_a_dense_fragment_pull_bit_for_bit():
    pair = Pair("topk:1")
    walk = _walk(5)
    pair.whole(next(walk))
    for i, w in enumerate(walk):
        assert torch.equal(pair.fragment(i % 2, w), FRAGS.gather(i % 2, w))
    assert pair.view.compressed_replies == 8


def test_without_error_feedback_the_shard_keeps_the_fragment_weights_it_sent():
    pair = Pair("topk:0.01", ef=False)
    walk = _walk(3)
    pair.whole(next(walk))
    w = next(walk)
    pair.fragment(1, w)
    assert torch.equal(FRAGS.gather(1, pair.mirror()), FRAGS.gather(1, w))
    assert not torch.equal(FRAGS.gather(1, pair.view.copy), FRAGS.gather(1, w))  # what top-k left out is lost


def test_a_lost_reply_resyncs_its_fragment_on_the_retry_and_every_other_fragment_at_its_next_pull():
    pair = Pair("sign")
    walk = _walk(6)
    pair.whole(next(walk))
    pair.fragment(0, next(walk))
    pair.fragment(1, next(walk))
    w = next(walk)
    pair.fragment(0, w, lose=1)  # shard 1's reply never arrives: the worker still holds its older copy
    dense = pair.view.dense_replies
    a, b = FRAGS.bounds[0][1]  # shard 1's piece of fragment 0
    assert torch.equal(pair.fragment(0, w)[a:b], FRAGS.gather(0, w)[a:b])  # the retry: shard 1 sends it dense
    assert pair.view.dense_replies == dense + 1
    dense = pair.view.dense_replies
    pair.fragment(1, next(walk))  # shard 1 no longer knows the worker's copy of fragment 1: dense too
    assert pair.view.dense_replies == dense + 1
    pair.fragment(0, next(walk))
    assert pair.view.dense_replies == dense + 1  # and from then on compressed again
    assert torch.equal(pair.view.copy, pair.mirror())


def test_each_fragment_resyncs_every_resync_pulls_of_its_own_and_a_whole_pull_resets_them():
    pair = Pair("sign", resync=3)
    walk = _walk(12)
    pair.whole(next(walk))
    kinds = []
    for i in range(8):
        dense = pair.view.dense_replies
        pair.fragment(i % 2, next(walk))
        kinds.append("d" if pair.view.dense_replies > dense else "c")
    assert "".join(kinds) == "ccccdd" + "cc"  # fragment f's third pull since the whole one is dense
    pair.whole(next(walk), final=True)
    assert torch.equal(pair.view.copy, pair.mirror())
    dense = pair.view.dense_replies
    pair.fragment(0, next(walk))
    assert pair.view.dense_replies == dense  # the whole dense pull made every fragment known


def test_after_a_hello_a_fragment_pull_is_dense_and_a_backup_answers_alike():
    pair = Pair("randomk:0.1")
    walk = _walk(8)
    pair.whole(next(walk))
    pair.fragment(0, next(walk))
    for s, copies in enumerate(pair.shards):  # HELLO again: every copy forgotten
        copies.greet(0, copies.check(0, pair.view.hello_fields(s), copies.copies[0].ref.numel()))
    dense = pair.view.dense_replies
    pair.fragment(1, next(walk))
    assert pair.view.dense_replies == dense + 2  # one per shard
    pair.fragment(0, next(walk))  # fragment 0 is not known since the HELLO either
    assert pair.view.dense_replies == dense + 4
    pair.fragment(1, next(walk))
    assert pair.view.dense_replies == dense + 4
    backups = []
    for s, copies in enumerate(pair.shards):
        b = PullCopies(s)
        b.load_state_dict(copies.state_dict(), copies.copies[0].ref.numel())
        backups.append(b)
    w = next(walk)
    for s, (lo, hi) in enumerate(PLAN.ranges):
        key = tuple(tuple(r) for r in FRAGS.shard_ranges(0, s))
        have = pair.view.request(s)["view"]
        mine = pair.shards[s].answer_fragment(0, w[lo:hi], key, have=have, final=False)
        theirs = backups[s].answer_fragment(0, w[lo:hi], key, have=have, final=False)
        assert mine[0] == theirs[0] and "pull_codec" in mine[0]
        assert all(torch.equal(mine[2][k], theirs[2][k]) for k in mine[2])  # random-k's stream travelled too


def test_the_dense_ranges_within_a_fragment_are_in_its_gathered_coordinates():
    assert within([[0, 4], [10, 12], [20, 30]], ((2, 11), (20, 25))) == [[0, 2], [8, 14]]
    assert within([[0, 4]], ((5, 9),)) == []


def test_a_lost_fragment_reply_is_answered_dense_on_the_retry_through_the_real_client():
    """One async shard and a real PSClient in this thread (tests/inproc.py), streaming DiLoCo's fragment pushes
    (StreamingOuter) with sign pulls: one WEIGHTS reply lost, the client's retry (same request) is applied
    once and answered dense, the other fragment's next pull too, and the copy and the mirror stay equal bit
    for bit."""
    from psrv.config import OptimConfig, ServerConfig
    from psrv.client.streaming import StreamingOuter
    from tests.inproc import InProcess
    plan = PartitionPlan(PLAN.params, 1)
    cluster = InProcess([ServerConfig(shard=0, num_shards=1, workers=1, mode="async",
                                      optimizer=OptimConfig("sgd", lr=0.5))])
    client = cluster.client(0, plan, compress_pull="sign", pull_resync=0, compress_min_numel=100, retry_interval=0.02)
    welcome = client.hello()
    params = torch.randn(N, generator=torch.Generator().manual_seed(1))
    client.init(params.clone())
    client.first_pull(welcome, out=params)
    outer = StreamingOuter(client, params, params.clone(), Fragments(plan, 2))
    service, send = cluster.services[0], cluster.services[0].transport.send
    lost = []

    def lose_one_weights_reply(peer, frames):
        if not lost and outer.pushes == 3 and decode(frames).type is MsgType.WEIGHTS:
            lost.append(frames)
            return
        send(peer, frames)
    service.transport.send = lose_one_weights_reply
    gen = torch.Generator().manual_seed(2)
    for clock in range(6):
        params.sub_(0.01 * torch.randn(N, generator=gen))  # the inner steps
        dense = client.pull_view.dense_replies
        outer.send(clock, step=clock)
        outer.merge()
        # the lost one's retry comes dense, and the other fragment's next pull: the shard lost track of the copy
        assert client.pull_view.dense_replies == dense + (clock in (3, 4))
    assert lost and service.shard.version == 6  # the re-sent push was applied once
    assert client.pull_view.compressed_replies == 4
    assert torch.equal(client.pull_view.copy, service.pulls.copies.copies[0].ref)
