"""Whom a backup asks to join before it follows (psrv/server/replication/follower.py `_ask`), each backup a real
psrv.Server thread on 127.0.0.1 and each primary a line of the test's own (a ZmqServer that takes the join and never
answers), so only the asks are seen:

- its --backup-of addresses in turn, in the order given after the first, while the witness holds no configuration;
- the primary the witness names, over the address it was given;
- its first address and no other while the witness names the backup itself primary (a replica restarted at the
  address it served from);
- no one, where the witness says the shard finished: it ends, in one line."""
from __future__ import annotations

import logging
import socket
import time

from psrv.server.replication import stream
from psrv.server.replication.witness import Configuration, Witness
from psrv.transport.zmq import ZmqServer
from tests.conformance.cluster import TIMEOUT, one_thread  # noqa: F401 (an autouse fixture)
from tests.conformance.replica_pair import NOWHERE, backup_of


def test_a_backup_given_several_addresses_asks_them_in_the_order_given(tmp_path):
    """Before the witness names a primary, a backup says "join" to its --backup-of addresses in turn, the next one
    each JOIN_EVERY, in the order given after the first (psrv/server/replication/follower.py _ask): two of the
    test's own that never answer, after one where nothing listens."""
    lines = [ZmqServer("tcp://127.0.0.1:0") for _ in range(2)]
    backup = backup_of(",".join([NOWHERE, *(line.address for line in lines)]), tmp_path / "witness")
    first_join: dict[int, float] = {}
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(first_join) < 2 and time.monotonic() < deadline:
            for i, line in enumerate(lines):
                got = line.recv(0.005)
                if got is not None and i not in first_join:
                    assert stream.read(got[1])[0]["op"] == "join", got
                    first_join[i] = time.monotonic()
        assert sorted(first_join) == [0, 1] and first_join[0] < first_join[1], first_join
    finally:
        backup.stop()
        backup.join(TIMEOUT)
        for line in lines:
            line.close()


def test_a_backup_asked_to_join_a_finished_shard_ends_in_one_line(tmp_path, caplog):
    """A backup whose witness says the shard finished (every worker left) asks no one to join and ends, saying so
    (psrv/server/replication/follower.py _ask)."""
    hand = ZmqServer("tcp://127.0.0.1:0")
    Witness(tmp_path / "witness", 0).claim(Configuration(1, hand.address).ended())
    caplog.set_level(logging.INFO, logger="psrv.server")
    backup = backup_of(hand.address, tmp_path / "witness")
    try:
        backup.join(TIMEOUT)
        assert hand.recv(0.3) is None, "a backup of a finished shard asked to join it"
    finally:
        backup.stop()
        hand.close()
    said = [r.getMessage() for r in caplog.records if "finished" in r.getMessage()]
    assert said == ["shard 0: the shard finished (every worker left) while this backup was joining; it ends"], said


def test_a_backup_joins_the_primary_its_witness_names_not_the_address_it_was_given(tmp_path):
    """A witness that names a primary (here the test's own) is asked over the --backup-of address (where nothing
    listens): the join goes where the witness says (psrv/server/replication/follower.py _ask)."""
    hand = ZmqServer("tcp://127.0.0.1:0")
    Witness(tmp_path / "witness", 0).claim(Configuration(1, hand.address))
    backup = backup_of(NOWHERE, tmp_path / "witness")
    try:
        got = hand.recv(TIMEOUT)
        assert got is not None and stream.read(got[1])[0]["op"] == "join", "the backup never asked the witness's primary"
    finally:
        backup.stop()
        backup.join(TIMEOUT)
        hand.close()


def test_a_backup_its_witness_names_primary_asks_its_first_address_and_no_other(tmp_path):
    """A backup restarted at the address its witness names as the shard's primary (it served the shard before)
    asks the first of its --backup-of addresses to join, each time, rather than going round them
    (psrv/server/replication/follower.py _ask): two lines of the test's own, of which only the first is asked."""
    with socket.socket() as s:  # an address for the backup that the witness can name before it starts
        s.bind(("127.0.0.1", 0))
        own = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    Witness(tmp_path / "witness", 0).claim(Configuration(1, own))
    lines = [ZmqServer("tcp://127.0.0.1:0") for _ in range(2)]
    backup = backup_of(",".join(line.address for line in lines), tmp_path / "witness", bind=own)
    try:
        assert backup.address == own, backup.address
        for _ in range(3):  # three asks, JOIN_EVERY apart
            got = lines[0].recv(TIMEOUT)
            assert got is not None and stream.read(got[1])[0]["op"] == "join", got
        assert lines[1].recv(0) is None, "the backup went round its addresses while its witness named it primary"
    finally:
        backup.stop()
        backup.join(TIMEOUT)
        for line in lines:
            line.close()
