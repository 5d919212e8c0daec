"""A shard's answers to pulls (psrv/server/pulls/handler.py) where the matrix's runs do not look closely, found by
`make mutants`: the fastest step time a PUSH_PULL's answer carries (dynamic local steps, psrv/local_period.py) is
the fastest of the workers active now; a worker that leaves takes its waiting pulls and its compressed-pull copy
with it; a compressed pull is answered against the copy the worker names, and dense when final. A ShardService
driven by hand, its replies recorded; the reference: the numbers this file sent."""
from __future__ import annotations

import json

import torch

from psrv.config import OptimConfig, ServerConfig
from psrv.history import History
from psrv.protocol import Message, MsgType
from psrv.server.service import ShardService
from tests.helpers import RecordingNet, hand_driven, hello_fields
from tests.helpers import send_to as send

N = 64
PULL = {"codec": "topk:0.1", "resync": 0, "dense": [], "error_feedback": True, "sign_scale": "l1"}


def service(mode: str, workers: int, pull: dict | None = None, rule: str = "plain",
            history: History | None = None) -> tuple[ShardService, RecordingNet]:
    """The shard, its HELLO and INIT answered and their replies cleared."""
    optimizer = OptimConfig("sgd", lr=0.1, momentum=0.0, update_rule=rule)
    svc, net = hand_driven(ServerConfig(workers=workers, mode=mode, optimizer=optimizer), N,
                           {"pull": pull} if pull else None, history)
    net.out.clear()
    return svc, net


def test_a_push_pulls_answer_carries_the_fastest_step_time_of_the_active_workers():
    svc, net = service("async", 3)
    answers = []
    for worker, seq, seconds in [(0, 3, 0.03), (1, 3, 0.01), (2, 3, None), (0, 4, 0.05)]:
        fields = {} if seconds is None else {"step_seconds": seconds}
        send(svc, Message(MsgType.PUSH_PULL, worker=worker, seq=seq, clock=seq - 3, fields=fields,
                          tensor=torch.ones(N)))
        (reply,) = net.out
        net.out.clear()
        assert reply.type is MsgType.WEIGHTS, reply
        answers.append(reply.fields["push"].get("fastest_step_seconds"))
    assert answers == [0.03, 0.01, 0.01, 0.01]
    send(svc, Message(MsgType.LEAVE, worker=1, seq=4))
    net.out.clear()
    send(svc, Message(MsgType.PUSH_PULL, worker=0, seq=5, clock=2, fields={"step_seconds": 0.05},
                      tensor=torch.ones(N)))
    assert net.out[0].fields["push"]["fastest_step_seconds"] == 0.05  # worker 1's 0.01 left with it


def test_a_worker_that_leaves_takes_its_waiting_pulls_and_its_copy_with_it():
    svc, net = service("sync", 3, pull=PULL)
    pulls = svc.pulls
    send(svc, Message(MsgType.PUSH_PULL, worker=1, seq=3, clock=0, tensor=torch.ones(N)))
    send(svc, Message(MsgType.PUSH_PULL, worker=2, seq=3, clock=0, tensor=torch.ones(N)))
    assert net.out == [] and pulls.pending.workers() == {1, 2}  # the barrier waits for worker 0
    assert set(pulls.copies.copies) == {0, 1, 2}
    send(svc, Message(MsgType.LEAVE, worker=1, seq=4))
    assert [m.type for m in net.out] == [MsgType.OK]  # its LEAVE's answer; its pull is not answered
    net.out.clear()
    assert pulls.pending.workers() == {2} and set(pulls.copies.copies) == {0, 2}
    send(svc, Message(MsgType.PUSH_PULL, worker=0, seq=3, clock=0, tensor=torch.ones(N)))
    # the barrier of workers 0 and 2 closed: each is answered the weights after it, worker 1 nothing
    assert [(m.type, m.fields["version"]) for m in net.out] == [(MsgType.WEIGHTS, 1)] * 2
    assert pulls.pending.workers() == set()


def test_a_pull_before_any_hello_is_told_to_say_hello():
    net = RecordingNet()
    svc = ShardService(ServerConfig(workers=1, mode="async"), net)
    send(svc, Message(MsgType.PULL, worker=0, seq=1))
    (reply,) = net.out
    assert reply.type is MsgType.ERROR and reply.fields["hello"] is True
    assert reply.fields["message"] == "PULL before any HELLO"


def test_rank_0s_final_pull_waits_for_the_others_to_leave_and_no_barrier_waits_for_it(tmp_path):
    """A final pull (rank 0's last, `final`): rank 0 pushes no more, so worker 1's next sync barrier closes without
    it, and its answer waits until worker 1 has left (rank 0 then ends the run); the history records its finish once."""
    svc, net = service("sync", 2, history=History(tmp_path / "shard.jsonl"))
    for worker in (0, 1):
        send(svc, Message(MsgType.PUSH_PULL, worker=worker, seq=3, clock=0, tensor=torch.ones(N)))
    net.out.clear()
    for _ in range(3):  # re-sent, as a client does when it hears nothing: one pull, one "finish" record
        send(svc, Message(MsgType.PULL, worker=0, seq=4, clock=1, fields={"final": True}))
    assert net.out == [] and svc.pulls.pending.workers() == {0}
    svc.state.history.close()
    members = [e for e in map(json.loads, (tmp_path / "shard.jsonl").read_text().splitlines()) if e["ev"] == "member"]
    assert [(e["w"], e["what"], e["epoch"]) for e in members if e["what"] == "finish"] == [(0, "finish", 0)]
    send(svc, Message(MsgType.PUSH_PULL, worker=1, seq=4, clock=1, tensor=torch.ones(N)))
    assert [(m.type, m.seq, m.fields["version"]) for m in net.out] == [(MsgType.WEIGHTS, 4, 2)]  # worker 1's alone
    net.out.clear()
    send(svc, Message(MsgType.LEAVE, worker=1, seq=5))
    assert [(m.type, m.seq) for m in net.out] == [(MsgType.WEIGHTS, 4), (MsgType.OK, 5)]  # released as it leaves
    assert net.out[0].fields["version"] == 2 and svc.pulls.pending.workers() == set()


def test_a_compressed_pull_is_dense_first_then_against_the_workers_copy_and_dense_again_when_final():
    """Under compressed pulls (top-k with error feedback) a worker's first pull is the weights, each later one
    naming the copy it holds (`view`) gets the change against it, and its final pull the weights again; DC-ASGD
    keeps, as the weights the worker pulled, the copy it holds, not the shard's weights; `waited` is the time the
    answer was held (none here: async answers at once)."""
    svc, net = service("async", 1, pull=PULL, rule="dc-asgd")
    gen = torch.Generator().manual_seed(12)
    view = None
    kinds = []
    for seq in range(3, 7):
        final = seq == 6
        fields = {**({} if view is None else {"view": view}), **({"final": True} if final else {})}
        if final:
            send(svc, Message(MsgType.PULL, worker=0, seq=seq, clock=seq - 3, fields=fields))
        else:
            send(svc, Message(MsgType.PUSH_PULL, worker=0, seq=seq, clock=seq - 3, fields=fields,
                              tensor=torch.randn(N, generator=gen)))
        (reply,) = net.out
        net.out.clear()
        assert reply.type is MsgType.WEIGHTS and 0 <= reply.fields["waited"] < 5.0, reply.fields
        kinds.append("dense" if reply.tensor is not None else "compressed")
        view = reply.fields["view"]
        copy = svc.pulls.copies.copies[0].ref
        if kinds[-1] == "compressed":  # top-k's copy is not the weights: the rule keeps the copy
            assert not torch.equal(copy, svc.shard.weights)
            assert torch.equal(svc.shard.rule.pulled_weights[0], copy)
    assert kinds == ["dense", "compressed", "compressed", "dense"]


def test_each_answer_says_its_next_clock_and_gap_and_is_recorded_in_the_history(tmp_path):
    """An async shard's answer to worker 0's k-th push-pull: the clock it pushes next (k), the clock gap to the
    slowest worker (here it alone pushes, so k ahead of worker 1, at least 1), its epoch (0, and no replicas: a shard
    without a witness names none; test_replication_edges.py has one with), and the history's `answer` record
    the history checker reads (docs/history.md): its worker, seq, clock, version and epoch."""
    svc, net = service("async", 2, history=History(tmp_path / "shard.jsonl"))
    for seq in (3, 4, 5):
        send(svc, Message(MsgType.PUSH_PULL, worker=0, seq=seq, clock=seq - 3, tensor=torch.ones(N)))
        (reply,) = net.out
        net.out.clear()
        assert (reply.fields["clock"], reply.fields["gap"]) == (seq - 2, seq - 2), reply.fields
        assert reply.fields["epoch"] == 0 and "replicas" not in reply.fields  # no witness: no replicas to name
    svc.state.history.close()
    lines = (tmp_path / "shard.jsonl").read_text().splitlines()
    answers = [e for e in map(json.loads, lines) if e["ev"] == "answer"]
    assert [(e["w"], e["seq"], e["clock"], e["version"], e["epoch"]) for e in answers] == [
        (0, 3, 1, 1, 0), (0, 4, 2, 2, 0), (0, 5, 3, 3, 0)]


def test_a_compressed_fragment_pull_is_dense_first_then_against_the_copy_and_dense_again_when_final():
    """Streaming DiLoCo's pulls of one fragment (`fragment`), under compressed pulls: as a whole pull, per fragment."""
    svc, net = service("async", 1, pull=PULL)
    gen = torch.Generator().manual_seed(13)
    view, kinds = None, []
    for seq in range(3, 7):
        send(svc, Message(MsgType.PUSH, worker=0, seq=100 + seq, clock=seq - 3, tensor=torch.randn(N, generator=gen)))
        net.out.clear()
        fields = {"fragment": [[0, 32]], **({} if view is None else {"view": view}),
                  **({"final": True} if seq == 6 else {})}
        send(svc, Message(MsgType.PULL, worker=0, seq=seq, clock=seq - 2, fields=fields))
        (reply,) = net.out
        net.out.clear()
        assert reply.type is MsgType.WEIGHTS, reply.fields
        kinds.append("dense" if reply.tensor is not None else "compressed")
        view = reply.fields["view"]
    assert kinds == ["dense", "compressed", "compressed", "dense"]


def test_a_sync_joiners_pull_for_a_later_clock_moves_where_it_counts_from_and_the_history_says_so(tmp_path):
    """A sync worker that joined while another pushes counts from the clock after the open one; a pull for a later
    clock (another shard welcomed it later) moves that, a PUSH_PULL's to the clock after its push's. Each move is
    one `member` record (what "expect", with the clock: experiments/launcher/history/replay.py reads it); a pull for
    the clock it counts from already records nothing, nor does a worker that is not joining."""
    svc, net = service("sync", 3, history=History(tmp_path / "shard.jsonl"))
    controller = svc.state.controller
    for w in (1, 2):  # each leaves and comes back while the others push clock 0
        send(svc, Message(MsgType.LEAVE, worker=w, seq=3))
        send(svc, Message(MsgType.HELLO, worker=w, seq=1, fields=hello_fields(N, 3)))
    assert [controller.counted_from(w) for w in range(3)] == [None, 1, 1]
    send(svc, Message(MsgType.PULL, worker=0, seq=3, clock=4))  # not joining: nothing to move
    send(svc, Message(MsgType.PULL, worker=1, seq=3, clock=1))  # the clock it counts from: nothing moves
    send(svc, Message(MsgType.PULL, worker=2, seq=3, clock=3))
    send(svc, Message(MsgType.PULL, worker=2, seq=4, clock=3))  # the same clock again: nothing moves
    send(svc, Message(MsgType.PUSH_PULL, worker=1, seq=4, clock=4, tensor=torch.ones(N)))  # pulls for clock 5
    assert [controller.counted_from(w) for w in range(3)] == [None, 5, 3]
    svc.state.history.close()
    records = [e for e in map(json.loads, (tmp_path / "shard.jsonl").read_text().splitlines())
               if e["ev"] == "member" and e["what"] == "expect"]
    assert [(e["w"], e["epoch"], e["from_clock"]) for e in records] == [(2, 0, 3), (1, 0, 5)], records


def test_a_pull_that_comes_before_the_weights_are_initialised_waits_for_init():
    """A worker welcomed before rank 0's INIT pulls at once: its pull waits, and is answered the INIT's weights
    once they come (psrv/server/pulls/handler.py release: nothing is answered from a shard not yet initialised)."""
    net = RecordingNet()
    svc = ShardService(ServerConfig(workers=2, mode="async"), net)
    for w in (0, 1):
        send(svc, Message(MsgType.HELLO, worker=w, seq=1, fields=hello_fields(N, 2)))
    net.out.clear()
    send(svc, Message(MsgType.PULL, worker=1, seq=2, clock=0))
    assert net.out == [] and svc.pulls.pending.workers() == {1}
    init = torch.arange(N, dtype=torch.float32)
    send(svc, Message(MsgType.INIT, worker=0, seq=2, tensor=init))
    weights = [m for m in net.out if m.type is MsgType.WEIGHTS]
    assert len(weights) == 1 and weights[0].seq == 2 and torch.equal(weights[0].tensor, init), net.out


def test_each_shard_draws_its_random_k_pulls_from_a_stream_of_its_own():
    """Compressed pulls under random-k: the positions a shard sends are drawn from a stream of the worker's and the
    shard's own (psrv/server/pulls/copies.py `for_shard`), so two shards given the same change do not choose the
    same positions, and the same shard always does."""
    pull = {**PULL, "codec": "randomk:0.1"}

    def positions(shard: int) -> torch.Tensor:
        cfg = ServerConfig(workers=1, mode="async", shard=shard, num_shards=2,
                           optimizer=OptimConfig("sgd", lr=0.1, momentum=0.0))
        svc, net = hand_driven(cfg, N, {"pull": pull})
        net.out.clear()
        send(svc, Message(MsgType.PULL, worker=0, seq=3, clock=0))  # dense: the copy made
        view = net.out[-1].fields["view"]
        send(svc, Message(MsgType.PUSH_PULL, worker=0, seq=4, clock=0, fields={"view": view},
                          tensor=torch.linspace(-1, 1, svc.state.shard.size)))  # the same change on each
        reply = net.out[-1]
        assert reply.type is MsgType.WEIGHTS and "pull_codec" in reply.fields, reply
        return reply.parts["indices"]

    zero, one = positions(0), positions(1)
    assert torch.equal(zero, positions(0)) and not torch.equal(zero, one)
