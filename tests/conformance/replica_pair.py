"""A primary and one backup that follows it, with no worker yet, for the cases that act on replication by hand
(test_replication_edges.py: stream messages sent from a line of our own; test_witness_faults.py: a witness that
fails while the primary is silent). psrv.Server threads on 127.0.0.1 with a witness, as the failure cases run
them; each records its history (history_of)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import time

import pytest

from psrv.config import RunConfig
from psrv.protocol import Message, MsgType
from psrv.protocol.codec import decode, encode
from psrv.server.run import Server
from psrv.server.replication import stream
from psrv.transport.zmq_client import ZmqClient
from tests.conformance.cluster import TIMEOUT, Hooks, start_backups
from tests.conformance.failures import config, quiet

QUIET_S = 0.5  # how long an ignored message is given to be answered anyway
NOWHERE = "tcp://127.0.0.1:9"  # an address where nothing listens: a replica a witness or a state may name


def backup_of(addresses: str, witness, *, cfg: RunConfig | None = None, bind: str = "tcp://127.0.0.1:0") -> Server:
    """A started backup of shard 0 (a psrv.Server thread) given --backup-of `addresses` and the witness folder
    `witness`, under `cfg` (default: async, one backup, no failover meant)."""
    cfg = cfg or quiet(config("async", replicas=1))
    return Server(dataclasses.replace(cfg.server_config(0, bind=bind), backup_of=addresses,
                                      witness=str(witness))).start()


@contextlib.contextmanager
def serving_pair(cfg: RunConfig, witness: str, history: str):
    """(primary, backup) of shard 0 under `cfg` (cfg.cluster.replicas = 1), deciding epochs on `witness`,
    recording their histories in `history`; both stopped and joined at the end."""
    hooks = Hooks()
    hooks.history = history
    primary = hooks.server(dataclasses.replace(cfg.server_config(0, bind="tcp://127.0.0.1:0"),
                                               witness=witness)).start()
    try:
        [backup] = start_backups(cfg, [primary], witness, hooks)
    except BaseException:
        primary.stop()
        raise
    try:
        yield primary, backup
    finally:
        for s in (backup, primary):
            s.stop()
        for s in (backup, primary):
            s.join(TIMEOUT)
        hooks.close_histories()


@pytest.fixture
def pair(tmp_path):
    """(primary, backup, witness folder), where no failover is meant (failures.py quiet)."""
    with tempfile.TemporaryDirectory(prefix="psrv-witness-") as witness:
        with serving_pair(quiet(config("async", replicas=1)), witness, str(tmp_path)) as (primary, backup):
            yield primary, backup, witness


@pytest.fixture
def line(pair):
    """A line of our own to the backup (a DEALER, as a primary's link is)."""
    _, backup, _ = pair
    link = ZmqClient([backup.address], link=True)
    yield link
    link.close()


def answer(link, timeout: float = TIMEOUT) -> dict | None:
    got = link.recv(timeout)
    return None if got is None else stream.read(got[1])[0]


def said(caplog, text: str) -> bool:
    return any(r.getMessage() == text for r in caplog.records if r.name == "psrv.server")


def history_of(server) -> list[dict]:
    """The events `server` recorded so far (docs/history.md)."""
    with open(server.service.state.history.path) as f:
        return [json.loads(line) for line in f if line.strip()]


def follower(backup):
    return backup.service.replication.follower


def wait_for(what: str, done) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def heartbeat(server) -> ZmqClient:
    """A worker's request (worker 0's HEARTBEAT, seq 1) to `server`, from a worker of our own, to read its answer."""
    worker = ZmqClient([server.address])
    worker.send(0, encode(Message(MsgType.HEARTBEAT, worker=0, seq=1, session=7)))
    return worker


def worker_answer(server, what: str, timeout: float = TIMEOUT) -> Message:
    """`server`'s answer to a worker's request (heartbeat's) within `timeout`, decoded; `what` says in the
    failure what did not answer."""
    worker = heartbeat(server)
    try:
        got = worker.recv(timeout)
    finally:
        worker.close()
    assert got is not None, f"{what} did not answer a worker's request"
    return decode(got[1])
