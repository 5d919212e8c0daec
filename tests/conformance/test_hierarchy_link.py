"""The failure paths and edges of a regional shard's link to its global shard (psrv/server/hierarchy/upstream.py
`Link`): a ready file naming no tcp address, a second live shard of one region, a global shard that never answers,
and a global 'shard' scripted on psrv's own transport (a real one would not misbehave) that refuses, answers what is
not weights, forgets the region, answers heartbeats as to a dropped region, answers late or not at all. Each ends
in one line, or with the region's weights and record as they should be."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from psrv.client.psclient import PSClient
from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import Message, MsgType, decode, encode
from psrv.server.hierarchy import upstream
from psrv.server.run import Server
from psrv.transport import create_server
from tests.conformance.hierarchy_shards import PLAN, SIZE, init_region0, merged, region0, stopped, wait_for_link


def test_an_upstream_ready_file_that_is_not_tcp_stops_the_regional_shard_naming_the_option(tmp_path):
    """(An upstream given as an address is checked by the config tree: tests/unit/test_hierarchy_config.py.)"""
    ready = tmp_path / "global-0.addr"
    ready.write_text("ipc:///tmp/psrv-no-such-global\n")
    assert stopped(region0(f"@{ready}")) == (f"--upstream @{ready}: 'ipc:///tmp/psrv-no-such-global': ipc:// is "
                                              "not a scheme psrv takes here; write tcp://HOST:PORT")


def test_a_second_shard_of_a_live_region_is_refused_by_the_global_shard():
    """Two processes syncing as region 0 at once: the global shard refuses the second (RANK_IN_USE: another
    session holds the region), and the second regional shard stops saying so."""
    top = Server(ServerConfig(mode="async", workers=2, optimizer=OptimConfig(name="sgd", lr=1.0, momentum=0.0)))
    top.start()
    first = region0(top.address)
    first.start()
    c1 = init_region0(first)
    try:
        merged(first, 0)
        said = stopped(region0(top.address))
        c1.leave()
        first.join()
    finally:
        c1.close()
        first.close()
        top.close()
    assert said.startswith(f"the global shard {top.address} refused HELLO: rank 0 is already in use")


def test_a_global_shard_that_never_answers_stops_the_regional_shard(monkeypatch):
    monkeypatch.setattr(upstream, "TIMEOUT", 1.0)
    said = stopped(region0("tcp://127.0.0.1:9"))  # discard: nothing answers there
    assert said == "HELLO to the global shard tcp://127.0.0.1:9 unanswered in 1s"


class _ScriptedGlobal(threading.Thread):
    """A global 'shard' on psrv's own zmq transport answering as told: WELCOME, OK, then `pull` for the PULL."""

    def __init__(self, pull: Message, hello_again: Message | None = None, *, worker_timeout: float = 10.0,
                 beats: list[dict] | None = None, delay: float = 0.0, silent: tuple = ()):
        """`hello_again`: the answer to every HELLO after the first; `beats`: the fields of the answers to the
        HEARTBEATs in turn (the last for the rest); `delay`: seconds before each answer; `silent`: the message
        types it never answers."""
        super().__init__(daemon=True)
        self.net = create_server("zmq", "tcp://127.0.0.1:0", shard=0, num_shards=1, workers=2)
        self.address, self.pull, self.stop = self.net.address, pull, threading.Event()
        self.hello_again, self.hellos = hello_again, 0
        self.worker_timeout, self.beats, self.heartbeats, self.delay = worker_timeout, beats or [{}], 0, delay
        self.silent = silent

    def close(self) -> None:
        self.stop.set()
        self.join(5)
        self.net.close()

    def _hello(self, m: Message) -> Message:
        self.hellos += 1
        if self.hellos > 1 and self.hello_again is not None:
            return Message(self.hello_again.type, seq=m.seq, fields=self.hello_again.fields)
        return Message(MsgType.WELCOME, seq=m.seq, fields={"worker_timeout": self.worker_timeout})

    def _beat(self, m: Message) -> Message:
        self.heartbeats += 1
        return Message(MsgType.OK, seq=m.seq, fields=self.beats[min(self.heartbeats, len(self.beats)) - 1])

    def run(self) -> None:
        answers = {MsgType.HELLO: self._hello, MsgType.HEARTBEAT: self._beat,
                   MsgType.INIT: lambda m: Message(MsgType.OK, seq=m.seq),
                   MsgType.PULL: lambda m: Message(self.pull.type, seq=m.seq, fields=self.pull.fields,
                                                   tensor=self.pull.tensor)}
        answers[MsgType.PUSH_PULL] = answers[MsgType.PULL]  # a sync: the same weights back
        while not self.stop.is_set():
            got = self.net.recv(0.05)
            if got is not None:
                msg = decode(got[1])
                if msg.type in self.silent:
                    continue
                time.sleep(self.delay)
                self.net.send(got[0], encode(answers.get(msg.type, answers[MsgType.INIT])(msg)))


def _stopped_by(top: "_ScriptedGlobal") -> str:
    """_stopped against the scripted `top`, started here and stopped after."""
    top.start()
    try:
        return stopped(region0(top.address))
    finally:
        top.close()


@pytest.mark.parametrize("pull,said", [
    (Message(MsgType.ERROR, fields={"code": 6, "message": "not now"}), "the global shard {address} refused PULL: not now"),
    (Message(MsgType.ERROR, fields={"code": 6}), "the global shard {address} refused PULL: {{'code': 6}}"),  # no message
    (Message(MsgType.OK), "sync with the global shard {address}: AttributeError: "),  # weights without a tensor
], ids=["refused", "refused-without-a-message", "malformed"])
def test_a_global_shard_s_refusal_or_malformed_answer_stops_the_regional_shard(caplog, pull, said):
    caplog.set_level(logging.INFO, logger="psrv.server")
    top = _ScriptedGlobal(pull)
    stopped = _stopped_by(top)
    assert stopped.startswith(said.format(address=top.address))
    assert "HELLO again" not in caplog.text  # a refusal without `hello` is not a region forgotten


def test_a_global_shard_that_forgot_the_region_and_refuses_its_hello_again_stops_the_regional_shard(caplog):
    """The global shard answers the first PULL as to a region it forgot (`hello`), then refuses the HELLO the
    region says again: the regional shard stops, naming the HELLO that was refused and why."""
    caplog.set_level(logging.INFO, logger="psrv.server")
    top = _ScriptedGlobal(Message(MsgType.ERROR, fields={"code": 6, "message": "who?", "hello": True}),
                          hello_again=Message(MsgType.ERROR, fields={"code": 6, "message": "not any more"}))
    stopped = _stopped_by(top)
    assert stopped == f"the global shard {top.address} refused HELLO: not any more"
    assert f"region 0: the global shard {top.address} forgot it; HELLO again" in caplog.text
    assert top.hellos == 2


def _scripted_run(top: "_ScriptedGlobal", until=lambda: True, what: str = "", ran: list | None = None,
                  pushes: int = 0) -> dict:
    """Region 0's shard against the scripted `top`: its worker says HELLO and sends the initial weights, waits
    until `until()` holds, pushes `pushes` times and leaves; the shard's summary (the shard appended to `ran`)."""
    top.start()
    shard = region0(top.address)
    if ran is not None:
        ran.append(shard)
    shard.start()
    c = init_region0(shard)
    try:
        deadline = time.monotonic() + 20.0
        while not until():
            assert time.monotonic() < deadline, what
            time.sleep(0.01)
        w = torch.zeros(SIZE)
        for k in range(pushes):
            c.push_pull(torch.ones(SIZE), clock=k, out=w)
        c.leave()
        return shard.join(timeout=60)
    finally:
        c.close()
        shard.close()
        top.close()


def test_a_heartbeat_answered_inactive_says_hello_again_once():
    """The global shard answers a heartbeat as to a region it dropped (`active` false), then as to an active
    one: the link says HELLO once more, before the next sync, and never again while it is kept."""
    top = _ScriptedGlobal(Message(MsgType.OK, tensor=torch.zeros(SIZE)), worker_timeout=0.3,
                          beats=[{"active": False}, {"active": True}])
    ran = []  # then a push, whose sync the end waits for: a heartbeat's round trip leaves it no answer to take
    summary = _scripted_run(top, lambda: top.heartbeats >= 4, "the link sent no heartbeats", ran, pushes=1)
    assert top.hellos == 2, top.hellos  # the join's HELLO and the one after the inactive answer
    assert ran[0]._service.upstream.link.beat == pytest.approx(0.3 / 3)  # a third of the global worker timeout
    assert summary["upstream"]["syncs"] == 1


def test_workers_that_leave_while_their_region_joins_wait_for_the_join():
    """The global shard answers each request 0.2 s late, and region 0's only worker leaves at once: the shard
    waits for its join (HELLO, INIT, PULL) to end, takes the global weights, and leaves without a sync."""
    weights = torch.linspace(0.0, 1.0, SIZE)
    top = _ScriptedGlobal(Message(MsgType.OK, tensor=weights), delay=0.2)
    summary = _scripted_run(top)
    assert summary["upstream"]["syncs"] == 0 and top.hellos == 1, summary["upstream"]


def test_a_leave_the_global_shard_never_answers_ends_the_regional_shard_after_leave_wait(monkeypatch):
    """The region's weights are final and its LEAVE goes unanswered: the shard waits LEAVE_WAIT (10 s, here
    1 s), not the round trip's TIMEOUT (120 s, here 2 s: the link's thread, still waiting, ends then), and ends
    saying so."""
    monkeypatch.setattr(upstream, "LEAVE_WAIT", 1.0)
    monkeypatch.setattr(upstream, "TIMEOUT", 2.0)
    top = _ScriptedGlobal(Message(MsgType.OK, tensor=torch.zeros(SIZE)), silent=(MsgType.LEAVE,))
    with pytest.raises(upstream.UpstreamError) as err:
        _scripted_run(top)
    assert str(err.value) == f"no answer from the global shard {top.address} in 1s"


def test_a_region_whose_workers_leave_while_it_joins_takes_the_global_weights_first():
    """Region 1 has no weights of its own: its only worker leaves while its join (HELLO, PULL, each answered
    0.2 s late) is in flight, and the shard still waits for the global weights and takes them before it leaves."""
    weights = torch.linspace(0.0, 1.0, SIZE)
    top = _ScriptedGlobal(Message(MsgType.OK, tensor=weights), delay=0.2)
    top.start()
    shard = Server(ServerConfig(mode="async", workers=1, first_rank=1, world_size=2, upstream=top.address,
                                upstream_every=1, region=1, upstream_world=2))
    shard.start()
    c = PSClient([shard.address], PLAN, worker=1, world_size=2)
    try:
        c.hello()
        wait_for_link(shard)
        c.leave()
        summary = shard.join(timeout=60)
        assert torch.equal(shard._service.shard.weights, weights), shard._service.shard.weights
        assert summary["upstream"]["syncs"] == 0 and top.hellos == 1
    finally:
        c.close()
        shard.close()
        top.close()


def test_a_links_heartbeats_leave_no_answer_behind():
    """Heartbeats between two round trips are answered inside the link: the next round trip's answer is its own
    weights, not a heartbeat's nothing."""
    weights = torch.linspace(0.0, 1.0, SIZE)
    top = _ScriptedGlobal(Message(MsgType.OK, tensor=weights), worker_timeout=0.3)  # a heartbeat every 0.1 s
    top.start()
    link = upstream.Link(top.address, region=0, regions=2,
                         hello={"plan_hash": "scripted", "total": SIZE, "num_shards": 1, "shard": 0})
    link.start()
    try:
        link.ask("join")
        assert torch.equal(link.wait(10.0), weights)
        deadline = time.monotonic() + 20.0
        while top.heartbeats < 3:
            assert time.monotonic() < deadline, "the link sent no heartbeats"
            time.sleep(0.01)
        link.ask("sync", torch.ones(SIZE), clock=1)
        assert torch.equal(link.wait(10.0), weights)
        link.ask("leave")
        assert link.wait(10.0) is None and link.answer() is None
    finally:
        link.close()
        top.close()

