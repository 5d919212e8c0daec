"""A backup on its primary's host is sent the stream over shared memory (psrv/transport/zmq.py ZmqServer.link):
each forwarded payload is copied into a slot of the primary's and read there in place by the backup, which the
primary writes again once the backup's loop has moved on. Two workers push in chunks at once, so a chunk of
one waits in the backup while the other's push is half applied (psrv/server/pushes/queued.py): the backup must keep
its own copy of it, or its state parts from the primary's. Shards and workers are threads of this process."""
from __future__ import annotations

import threading

import torch

import psrv
from psrv.config import OptimConfig, ServerConfig
from tests.replica_cluster import following, wait_for
from tests.states import assert_same_state

STEPS = 15


def _shard(witness, backup_of: str = "") -> psrv.Server:
    return psrv.Server(ServerConfig(workers=2, mode="async", optimizer=OptimConfig("adam", lr=1e-3),
                                    backup_of=backup_of, witness=str(witness), worker_timeout=30.0)).start()


def _train(address: str, rank: int) -> None:
    net = torch.nn.Linear(512, 512)  # 1 MB: 4 chunks of 0.25 MB, each over the plane's least payload
    gen = torch.Generator().manual_seed(rank)
    with psrv.Worker(net, [address], rank=rank, world_size=2, timeout=30.0, push_chunk_mb=0.25) as ps:
        for _ in range(STEPS):
            net.zero_grad()
            net(torch.randn(8, 512, generator=gen)).square().mean().backward()
            ps.step()


def test_a_backup_on_the_host_takes_the_stream_by_shared_memory_and_holds_the_primary_state(tmp_path):
    primary = _shard(tmp_path)
    backup = _shard(tmp_path, backup_of=primary.address)
    try:
        wait_for(lambda: following(backup))
        threads = [threading.Thread(target=_train, args=(primary.address, r), daemon=True) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
            assert not t.is_alive()
        ours, theirs = primary.join(30), backup.join(30)
        assert ours["updates_applied"] == theirs["updates_applied"] == 2 * STEPS
        assert theirs["payload_bytes"]["shm"] >= STEPS * 512 * 513 * 4  # most chunks (a few may go inline)
        assert_same_state(primary.service.state_dict(), backup.service.state_dict())
    finally:
        for s in (primary, backup):
            s.stop()
