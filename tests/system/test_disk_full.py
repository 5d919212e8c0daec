"""A disk that fills up during a checkpoint: the write fails with ENOSPC, the shard says so and goes on
answering pushes, the previous checkpoint stays whole (the new one was a temporary file, removed), a
CHECKPOINT request gets one INTERNAL error naming the server's log, and a shard resumed from the folder
loads the previous checkpoint.

A real full disk: a tmpfs of 3 MiB mounted for the test (root only, as CI runs), holding one checkpoint
of about 2 MiB but not a second beside it."""
from __future__ import annotations

import os
import subprocess

import pytest
import torch

from psrv.checkpoint import checkpoint_path, read_verified
from psrv.config import ServerConfig
from psrv.protocol import Message, MsgType, encode
from psrv.server.service import ShardService
from tests.helpers import RecordingNet
from tests.integration.test_checkpoint_background import MOMENTUM, SIZE, async_shard, push


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs at tmp_path/disk, unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True,
                             text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"this host cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


@pytest.mark.timeout(60)
def test_a_full_disk_fails_the_checkpoint_keeps_the_previous_one_and_the_shard_goes_on(small_disk, caplog):
    svc = async_shard(small_disk)
    svc.transport.authenticated = True
    path = checkpoint_path(small_disk, shard=0, num_shards=1)
    push(svc, 3, 1.0)
    assert svc.checkpoints.save() == str(path)  # about 2 MiB of the 3
    first = read_verified(path)["shard_state"]
    assert first["version"] == 1

    push(svc, 4, 2.0)
    svc.handle(b"admin", encode(Message(MsgType.CHECKPOINT, seq=100)))  # a second 2 MiB beside it cannot fit
    svc.checkpoints.writer.wait(30)
    svc.checkpoints.answer_admin()
    (reply,) = [m for m in svc.transport.out if m.seq == 100]
    assert reply.type is MsgType.ERROR and "checkpoint failed; see the server's log" in reply.fields["message"]
    assert any("No space left on device" in r.getMessage() for r in caplog.records), "the log says why"
    assert sorted(p.name for p in small_disk.iterdir()) == [path.name], "the torn temporary file was removed"
    assert torch.equal(read_verified(path)["shard_state"]["param"], first["param"])  # the previous one, whole

    push(svc, 5, 3.0)  # the shard goes on
    assert svc.shard.version == 3 and svc.summary()["checkpoints"] == 1
    assert svc.summary()["checkpoint_version"] == 1

    cfg = ServerConfig(workers=1, mode="async", optimizer=MOMENTUM, checkpoint_dir=str(small_disk), resume=True)
    resumed = ShardService(cfg, RecordingNet())  # --resume loads the checkpoint as it starts
    assert resumed.shard.version == 1 and torch.equal(resumed.shard.weights, first["param"][:SIZE])
