"""Compressed pulls, both ends without a network (psrv/codecs/pull.py, psrv/server/pulls/copies.py,
psrv/client/pull_view.py): the shard's mirror and the worker's copy stay equal bit for bit, so the copy
is the weights minus the residual exactly; top-k at ratio 1 is a dense pull; a copy the shard lost track
of (a lost reply, a HELLO), the resync period and the final pull come dense; bad settings are refused."""
from __future__ import annotations

import pytest
import torch

from psrv.codecs.pull import decode_pull, encode_pull, make_pull_codec
from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import Message, MsgType, ProtocolError, decode, encode
from psrv.server.pulls.copies import PullCopies
from psrv.client.pull_view import PullView
from tests.helpers import weight_walk

PLAN = PartitionPlan((ParamSpec("w", (3000,)), ParamSpec("b", (10,))), 1)  # b travels exactly (min_numel 100)
N = PLAN.total


def _pair(spec: str, *, ef: bool = True, resync: int = 0) -> tuple[PullCopies, PullView]:
    view = PullView(PLAN, spec, error_feedback=ef, resync=resync, min_numel=100, sign_scale="l2")
    copies = PullCopies()
    copies.greet(0, copies.check(0, view.hello_fields(0), N))
    return copies, view


def _pull(copies: PullCopies, view: PullView, weights: torch.Tensor, *, final: bool = False) -> torch.Tensor:
    """One pull through the wire format: the request's copy number, the shard's reply, the worker's take."""
    have = decode(encode(Message(MsgType.PULL, fields=view.request(0)))).fields["view"]
    fields, tensor, parts, _ = copies.answer(0, weights, have=have, final=final)
    reply = decode(encode(Message(MsgType.WEIGHTS, fields=fields, tensor=tensor, parts=parts)))
    out = torch.empty(N)
    view.take(0, reply, out)
    return out


def _walk(steps: int, seed: int = 0):
    return weight_walk(N, steps, seed)


@pytest.mark.parametrize("spec", ["sign", "topk:0.05", "randomk:0.05", "int8", "bfloat16"])
def test_the_copy_is_the_weights_minus_the_residual_exactly(spec):
    copies, view = _pair(spec)
    for i, w in enumerate(_walk(6)):
        out = _pull(copies, view, w)
        mirror = copies.copies[0].ref
        assert torch.equal(out, view.copy) and torch.equal(view.copy, mirror)  # bit for bit, both ends
        assert torch.equal(out[3000:], w[3000:])  # the small tensor travels as the weights themselves
        if i:  # after the first (dense) pull the residual w - copy is what the codec left out, and no more
            assert 0 < (w - out).abs().max() < 1.0
    assert view.dense_replies == 1 and view.compressed_replies == 5


def test_without_error_feedback_what_the_codec_left_out_is_lost():
    with_ef, view_ef = _pair("topk:0.01")
    without, view = _pair("topk:0.01", ef=False)
    for w in _walk(8):
        kept, lost = _pull(with_ef, view_ef, w), _pull(without, view, w)
    assert (w - lost).norm() > (w - kept).norm()  # the residual rode along with error feedback only
    assert torch.equal(without.copies[0].ref, w)  # the shard keeps the weights it sent from


def test_topk_at_ratio_one_is_a_dense_pull_bit_for_bit():
    copies, view = _pair("topk:1")
    for w in _walk(4):
        assert torch.equal(_pull(copies, view, w), w)
    assert view.compressed_replies == 3


def test_a_copy_the_shard_lost_track_of_the_period_and_the_final_pull_come_dense():
    copies, view = _pair("sign", resync=3)
    kinds = []
    for step, w in enumerate(_walk(9)):
        before = view.dense_replies
        if step == 5:
            view.numbers[0] += 1  # as if the last reply was lost: the worker holds another copy than the shard thinks
        out = _pull(copies, view, w, final=step == 8)
        kinds.append("dense" if view.dense_replies > before else "delta")
        if kinds[-1] == "dense":
            assert torch.equal(out, w)
    # the first; every third (the period counts from the last dense one); the lost track at 5; the final pull
    assert kinds == ["dense", "delta", "delta", "dense", "delta", "dense", "delta", "delta", "dense"]
    copies.greet(0, copies.check(0, view.hello_fields(0), N))  # a HELLO again (a reconnect): dense
    before = view.dense_replies
    _pull(copies, view, w)
    assert view.dense_replies == before + 1


def test_a_worker_without_compressed_pulls_gets_the_weights():
    copies, w = PullCopies(), torch.randn(N)
    fields, tensor, parts, held = copies.answer(3, w, have=0, final=False)
    assert fields == {} and tensor is w and parts is None and held is w


@pytest.mark.parametrize("pull, why", [
    ({"codec": "nope"}, "pull codec"), ({"codec": "sign", "resync": -1}, "resync"),
    ({"codec": "sign", "dense": [[5, 2]]}, "dense range"), ({"codec": "sign", "sign_scale": "l3"}, "sign_scale"),
    ("sign", "must be a map")])
def test_bad_pull_settings_at_hello_are_refused_in_one_line(pull, why):
    with pytest.raises(ProtocolError, match=why):
        PullCopies().check(0, pull, N)


def test_bad_worker_settings_say_the_option():
    with pytest.raises(ValueError, match="compress_pull"):
        PullView(PLAN, "topk", error_feedback=True, resync=1, min_numel=0, sign_scale="l2")
    with pytest.raises(ValueError, match="pull_resync"):
        PullView(PLAN, "sign", error_feedback=True, resync=-1, min_numel=0, sign_scale="l2")


def test_a_reply_that_disagrees_with_its_header_is_refused():
    fields, parts = encode_pull(make_pull_codec("sign", seed=0, sign_scale="l1"), torch.zeros(N), torch.randn(N),
                                ef=True, dense=[], among=None)
    with pytest.raises(ProtocolError, match="elements"):
        decode_pull(fields, parts, N - 1)
    with pytest.raises(ProtocolError, match="unknown pull codec"):
        decode_pull({**fields, "name": "zip"}, parts, N)


def test_the_config_tree_checks_the_pull_settings():
    from psrv.config import ConfigError, RunConfig, from_dict
    assert from_dict(RunConfig, {"worker": {"compress_pull": "topk:0.01"}}).worker.pull_resync == 100
    for tree, key in [({"worker": {"compress_pull": "topk"}}, "compress_pull"),
                      ({"worker": {"pull_resync": -1}}, "pull_resync"),
                      ({"mode": "ddp", "worker": {"compress_pull": "sign"}}, "compress_pull")]:
        with pytest.raises((ConfigError, ValueError), match=key):
            from_dict(RunConfig, tree)


def test_compressed_pulls_with_fragments_are_accepted():
    """A fragment's pull is the compressed change of that fragment (tests/conformance/test_fragment_pulls.py)."""
    from psrv.config import RunConfig, from_dict
    cfg = from_dict(RunConfig, {"worker": {"local_steps": 4, "fragments": 2, "compress_pull": "sign"}})
    assert (cfg.worker.fragments, cfg.worker.compress_pull) == (2, "sign")


def _inproc_worker():
    """One async shard and one PSClient with sign both ways, in this thread (tests/inproc.py)."""
    from psrv.config import OptimConfig, ServerConfig
    from tests.inproc import InProcess
    cluster = InProcess([ServerConfig(shard=0, num_shards=1, workers=1, mode="async", optimizer=OptimConfig("sgd", lr=0.1))])
    client = cluster.client(0, PLAN, compress="sign", compress_pull="sign", pull_resync=0, compress_min_numel=100,
                            retry_interval=0.02)
    welcome = client.hello()
    weights = torch.zeros(N)
    client.init(torch.randn(N, generator=torch.Generator().manual_seed(1)))
    client.first_pull(welcome, out=weights)
    return cluster, client, weights


def _steps(client, weights, clock: int, count: int) -> int:
    for _ in range(count):
        client.push_pull(torch.randn(N, generator=torch.Generator().manual_seed(clock)), clock=clock, out=weights)
        clock += 1
    return clock


def test_a_lost_compressed_reply_is_answered_dense_on_the_retry_and_the_copies_stay_equal():
    cluster, client, weights = _inproc_worker()
    clock = _steps(client, weights, 0, 3)
    service, send = cluster.services[0], cluster.services[0].transport.send
    lost = []

    def lose_one_weights_reply(peer, frames):
        if not lost and decode(frames).type is MsgType.WEIGHTS:
            lost.append(frames)
            return
        send(peer, frames)
    service.transport.send = lose_one_weights_reply
    dense_before = client.pull_view.dense_replies
    _steps(client, weights, clock, 2)
    assert lost and client.pull_view.dense_replies == dense_before + 1  # the retry's answer: dense
    assert service.shard.version == clock + 2  # the re-sent push was applied once
    assert torch.equal(client.pull_view.copy, service.pulls.copies.copies[0].ref)
    assert torch.equal(weights, client.pull_view.copy)


def test_a_restarted_shard_knows_no_copy_and_answers_dense():
    from psrv.server.service import ShardService
    cluster, client, weights = _inproc_worker()
    clock = _steps(client, weights, 0, 3)
    old = cluster.services[0]
    restarted = ShardService(old.cfg, old.transport)
    restarted.load_state_dict(old.state_dict(), source="the old shard")  # its weights and optimizer, no copies
    cluster.services[0] = restarted
    dense_before = client.pull_view.dense_replies
    _steps(client, weights, clock, 2)  # HELLO again (it forgot this worker), then a dense pull, then a change
    assert client.pull_view.dense_replies == dense_before + 1 and client.pull_view.compressed_replies == 4
    assert torch.equal(client.pull_view.copy, restarted.pulls.copies.copies[0].ref)
