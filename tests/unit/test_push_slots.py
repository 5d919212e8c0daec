"""A worker's push slots for one shard (psrv/transport/shm_memory.py): at most two payloads in flight
through shared memory, the rest inline; released ones are written again; idle, one is kept."""
from __future__ import annotations

from psrv.transport.shm_memory import RELEASED_AT, SEQ, PushSlots

CHUNK = memoryview(bytes(1 << 16))


def release(slots: PushSlots) -> None:
    """What the shard does at its next recv: mark each slot's payload read."""
    for slot in slots._slots:
        SEQ.pack_into(slot.map, RELEASED_AT, slot.seq)


def test_a_burst_of_chunks_takes_two_slots_and_the_rest_go_inline():
    slots = PushSlots(0)
    try:
        written = [slots.write(CHUNK) for _ in range(5)]
        assert [w is not None for w in written] == [True, True, False, False, False]
        assert len(slots) == 2
        release(slots)
        assert slots.write(CHUNK) is not None and len(slots) == 2  # a released slot is written again
    finally:
        slots.close()


def test_idle_keeps_one_released_slot():
    slots = PushSlots(0)
    try:
        slots.write(CHUNK)
        slots.write(CHUNK)
        slots.trim()
        assert len(slots) == 2  # nothing released yet: both still read
        release(slots)
        slots.trim()
        assert len(slots) == 1
    finally:
        slots.close()
