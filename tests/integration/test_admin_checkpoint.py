"""A CHECKPOINT request (psrv admin checkpoint) is written off the shard's loop like the periodic ones:
pushes are answered while it writes, and its OK, with the path and the version the file holds, comes once
the file is on disk. A request that arrives while another write is in flight waits for a write of its own,
taken after it asked; one still waiting when the shard stops is answered by the final checkpoint.

Writes are paced (PSRV_CHECKPOINT_BYTES_PER_S) so that one lasts about 2 s on a small shard."""
from __future__ import annotations

import time

import pytest

from psrv.checkpoint import PACE_ENV, checkpoint_path, read_verified
from psrv.protocol import Message, MsgType, encode
from tests.integration.test_checkpoint_background import PACE, async_shard, push


def ask(svc, seq: int) -> None:
    svc.handle(b"admin", encode(Message(MsgType.CHECKPOINT, seq=seq)))


def answers(svc, seq: int) -> list[Message]:
    return [m for m in svc.transport.out if m.seq == seq and m.type in (MsgType.OK, MsgType.ERROR)]


def tick_until_answered(svc, seq: int, timeout: float = 30.0) -> Message:
    """Run the loop's part for CHECKPOINT requests (as ShardService.serve does each poll) until `seq` is answered."""
    deadline = time.monotonic() + timeout
    while not answers(svc, seq):
        assert time.monotonic() < deadline, f"CHECKPOINT {seq} was not answered in {timeout} s"
        svc.checkpoints.answer_admin()
        time.sleep(0.02)
    (reply,) = answers(svc, seq)
    return reply


@pytest.mark.timeout(90)
def test_a_checkpoint_request_is_written_off_the_loop_and_answered_when_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv(PACE_ENV, str(PACE))
    svc = async_shard(tmp_path)
    svc.transport.authenticated = True
    path = checkpoint_path(tmp_path, shard=0, num_shards=1)
    for seq in range(3, 6):
        push(svc, seq, 1.0)
    started = time.perf_counter()
    ask(svc, 100)
    asked = time.perf_counter() - started
    assert not answers(svc, 100) and svc.checkpoints.writer.writing, \
        "the request's write runs from a thread, not the loop"
    latencies = [push(svc, seq, 2.0) for seq in range(6, 12)]  # answered while it writes
    assert svc.checkpoints.writer.writing and not answers(svc, 100), "the write ended before the pushes: pace it slower"

    ask(svc, 101)  # while 100's write is in flight: 101 must get a write taken after it asked (version 9)
    reply = tick_until_answered(svc, 100)
    written = time.perf_counter() - started
    assert reply.type is MsgType.OK and reply.fields == {"path": str(path), "version": 3}
    assert max(latencies) < written / 4 and asked < written / 4, (asked, latencies, written)

    reply = tick_until_answered(svc, 101)
    assert reply.type is MsgType.OK and reply.fields["version"] == 9 == svc.shard.version
    assert read_verified(path)["shard_state"]["version"] == 9
    assert svc.summary()["checkpoints"] == 2


@pytest.mark.timeout(90)
def test_a_request_still_waiting_at_the_end_gets_the_final_checkpoint_and_a_failed_write_an_error(
        tmp_path, monkeypatch):
    monkeypatch.setenv(PACE_ENV, str(PACE))
    svc = async_shard(tmp_path)
    svc.transport.authenticated = True
    push(svc, 3, 1.0)
    assert svc.checkpoints.start()  # a periodic write in flight: the request waits behind it
    ask(svc, 200)
    svc.handle(b"admin", encode(Message(MsgType.SHUTDOWN, seq=201)))
    summary = svc.serve(poll_interval=0.01)  # stopped: the final checkpoint answers 200
    (reply,) = answers(svc, 200)
    assert reply.type is MsgType.OK and reply.fields["version"] == 1 == svc.shard.version
    assert summary["checkpoints"] == 2 and read_verified(reply.fields["path"])["shard_state"]["version"] == 1

    svc = async_shard(tmp_path / "second")
    svc.transport.authenticated = True
    (tmp_path / "a-file").write_text("")
    svc.checkpoints.checkpointer.path = tmp_path / "a-file" / "shard.ckpt"  # a write that fails, even as root
    monkeypatch.delenv(PACE_ENV)
    ask(svc, 300)
    reply = tick_until_answered(svc, 300)
    assert reply.type is MsgType.ERROR and "checkpoint failed" in reply.fields["message"]
