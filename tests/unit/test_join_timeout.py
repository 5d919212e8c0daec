"""A worker a shard never hears from leaves the active set after the join timeout, the one
--join-timeout sets, and the shard says so: once while it waits, naming the workers not joined and
the bound, and once when it goes on without them (the fake clock of test_controllers_liveness)."""
from __future__ import annotations

import logging

import pytest
import torch

from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import Message, MsgType, encode
from psrv.server.service import ShardService
from tests.unit.test_controllers_liveness import FakeNet

pytestmark = pytest.mark.timeout(30)
SIZE = 4


class Clocked:
    """A sync ShardService of `workers` whose join timeout comes from its config, on a fake clock."""

    def __init__(self, workers: int, join_timeout: float):
        self.t = 0.0
        cfg = ServerConfig(workers=workers, mode="sync", worker_timeout=30.0, join_timeout=join_timeout,
                           optimizer=OptimConfig(name="sgd", lr=1.0, momentum=0.0))
        self.svc = ShardService(cfg, FakeNet(), now=lambda: self.t)

    def hello(self, worker: int) -> None:
        msg = Message(MsgType.HELLO, worker=worker, seq=1, fields={
            "plan_hash": "p", "total": SIZE, "num_shards": 1, "shard": 0, "world_size": self.svc.state.cfg.workers})
        self.svc.handle(f"peer-{worker}".encode(), encode(msg))

    def tick_to(self, t: float) -> None:
        """The shard idles until `t`, its loop looking every 0.1 s."""
        while self.t < t - 1e-9:
            self.t += 0.1
            self.svc.membership.check_liveness()


def messages(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "psrv.server"]


def test_the_shard_names_the_workers_not_joined_and_goes_on_without_them(caplog):
    s = Clocked(workers=3, join_timeout=4.0)
    with caplog.at_level(logging.INFO, logger="psrv.server"):
        s.hello(0)
        s.svc.handle(b"peer-0", encode(Message(MsgType.INIT, worker=0, seq=2, tensor=torch.zeros(SIZE))))
        s.tick_to(1.9)
        assert not [m for _, m in messages(caplog) if "joined" in m]  # not before half the bound
        s.tick_to(2.1)
        assert (logging.WARNING, "shard 0: workers 1, 2 not joined yet (no HELLO after 2.0s); going on without "
                "them at 4s (--join-timeout)") in messages(caplog)
        s.hello(1)
        s.tick_to(3.9)
        assert s.svc.controller.active == {0, 1, 2}
        s.tick_to(4.2)
    assert s.svc.controller.active == {0, 1} and s.svc.state.stats.lost_workers == [2]
    said = [m for _, m in messages(caplog) if "never joined" in m]
    assert said == ["shard 0: worker 2 never joined (no HELLO within --join-timeout 4s); going on without "
                    "them; a HELLO later brings them back"]
    assert not [m for _, m in messages(caplog) if "silent for" in m]  # not the line of a worker gone quiet


def test_a_shard_no_worker_joins_says_it_ends():
    s = Clocked(workers=2, join_timeout=1.0)
    s.tick_to(0.4)
    assert not s.svc.finished
    s.tick_to(1.2)
    assert s.svc.finished and s.svc.state.stats.lost_workers == [0, 1]


def test_no_worker_yet_is_said_at_info_and_the_end_as_a_warning(caplog):
    s = Clocked(workers=2, join_timeout=1.0)
    with caplog.at_level(logging.INFO, logger="psrv.server"):
        s.tick_to(1.2)
    said = [(level, m) for level, m in messages(caplog) if "joined" in m]
    assert said == [(logging.INFO, "shard 0: workers 0, 1 not joined yet (no HELLO after 0.5s); going on without "
                     "them at 1s (--join-timeout)"),
                    (logging.WARNING, "shard 0: workers 0, 1 never joined (no HELLO within --join-timeout 1s); "
                     "no worker left, the shard ends")]
