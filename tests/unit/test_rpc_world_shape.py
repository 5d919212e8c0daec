"""The RPC world's shape with replicated shards (psrv/transport/rpc_world.py): servers, then workers, then each
shard's backups, so a worker's rank does not depend on the replicas, and every member, the backups included,
has one name and one address that workers can be redirected to."""
from __future__ import annotations

import pytest

from psrv.transport.rpc_world import RpcWorld, member_of


def test_the_backups_come_after_the_workers_and_are_named_by_shard_and_number():
    world = RpcWorld("127.0.0.1:29500", servers=2, workers=3, replicas=2)
    names = [world.name(r) for r in range(world.size)]
    assert names == ["server-0", "server-1", "worker-0", "worker-1", "worker-2",
                     "backup-0-1", "backup-0-2", "backup-1-1", "backup-1-2"]
    assert [world.backup_rank(k, j) for k in (0, 1) for j in (1, 2)] == [5, 6, 7, 8]
    assert world.shape == "2,3,2"
    assert world.address_of("backup-1-2") == "rpc://127.0.0.1:29500/backup-1-2"


def test_without_replicas_the_world_is_what_it_was():
    world = RpcWorld("127.0.0.1:29500", servers=2, workers=2)
    assert world.size == 4 and world.shape == "2,2,0"
    assert [world.name(r) for r in range(4)] == ["server-0", "server-1", "worker-0", "worker-1"]


@pytest.mark.parametrize("address,member", [("rpc://h:1/server-3", "server-3"), ("rpc://h:1/backup-0-2", "backup-0-2")])
def test_a_replica_address_names_its_member(address, member):
    assert member_of(address) == member


@pytest.mark.parametrize("address", ["tcp://h:1", "rpc://h:1/worker-0", "rpc://h:1/backup-0", "rpc://h:1"])
def test_an_address_that_names_no_replica_is_refused_in_one_line(address):
    with pytest.raises(ValueError, match="rpc://HOST:PORT/server-I or rpc://HOST:PORT/backup-I-J"):
        member_of(address)
