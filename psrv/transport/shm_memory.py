"""The shared-memory plane's memory (psrv/transport/shm.py): memfds one side writes and the other maps.

A memfd starts with a HEADER of two 8-byte numbers: its writer's sequence number (odd while it writes,
even after: a sequence lock), and, in a worker's push slot, the sequence number of the payload the
shard has finished with (`released`, written by the shard). A descriptor names a memfd by its writer's
pid, fd, size and inode (an fd number is reused once closed; the inode is not while it is mapped), the
payload's place (off) and size (n), and the sequence number it was written under (seq).

A worker's push slots (PushSlots) are one per payload the shard has not finished with: the chunks of one
push (psrv/chunking.py) go back to back, each in a slot of its own, and a slot is written again only once
the shard has released the payload in it (or, after a new offer was accepted, never reads it again).
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Hashable

import msgpack
import numpy as np
import torch

HEADER = 64  # bytes before the payload: the sequence number, the released one, padding to a cache line
SEQ = struct.Struct("<Q")
RELEASED_AT = 8  # where in the header the shard says which payload of a push slot it has finished with
FIELDS = ("pid", "fd", "size", "ino", "n", "seq")


class Slot:
    """A memfd of ours, mapped."""

    def __init__(self, name: str, nbytes: int):
        self.fd = os.memfd_create(f"psrv-{name}", os.MFD_CLOEXEC)
        self.size = HEADER + nbytes
        os.ftruncate(self.fd, self.size)
        self.ino = os.fstat(self.fd).st_ino
        self.map = mmap.mmap(self.fd, self.size)
        self.seq = 0
        self.reclaimed = True  # written again without waiting for a release (nothing of it was sent)

    def write(self, payload: memoryview) -> dict:
        n = payload.nbytes
        self.seq += 1
        SEQ.pack_into(self.map, 0, self.seq)  # odd: being written
        memoryview(self.map)[HEADER:HEADER + n] = payload
        self.seq += 1
        SEQ.pack_into(self.map, 0, self.seq)
        self.reclaimed = False
        return self._named(n)

    def _named(self, n: int, **more) -> dict:
        return {"pid": os.getpid(), "fd": self.fd, "size": self.size, "ino": self.ino, "n": n, "seq": self.seq,
                **more}

    def free(self) -> bool:
        """Whether the reader is done with what this slot holds (it said so, or will never read it)."""
        return self.reclaimed or SEQ.unpack_from(self.map, RELEASED_AT)[0] == self.seq

    def close(self) -> None:
        close_map(self.map)
        os.close(self.fd)


class Region(Slot):
    """A tensor living in a memfd, sent by place: the shard's weights, under a sequence lock (odd: being
    written), or a worker's flat gradient."""

    def __init__(self, tensor: torch.Tensor, name: str = "weights"):
        nbytes = tensor.numel() * tensor.element_size()
        super().__init__(name, nbytes)
        self.tensor = torch.frombuffer(memoryview(self.map)[HEADER:HEADER + nbytes], dtype=tensor.dtype)
        self.tensor = self.tensor.view(tensor.shape).copy_(tensor)
        self._base = self.tensor.data_ptr() - HEADER
        self.seq = 2  # even: readable

    def offset_of(self, payload: memoryview) -> int | None:
        address = np.frombuffer(payload, dtype=np.uint8).ctypes.data if payload.nbytes else 0
        offset = address - self._base
        return offset if HEADER <= offset and offset + payload.nbytes <= self.size else None

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s bytes lie in this region (a view of its tensor: a shard's slice of the gradient)."""
        offset = tensor.data_ptr() - self._base
        return tensor.device.type == "cpu" and tensor.is_contiguous() and \
            HEADER <= offset and offset + tensor.numel() * tensor.element_size() <= self.size

    def describe(self, offset: int, n: int, **more) -> dict:
        SEQ.pack_into(self.map, 0, self.seq)
        return self._named(n, off=offset, **more)

    def begin_write(self) -> None:
        if self.seq % 2 == 0:
            self.seq += 1
            SEQ.pack_into(self.map, 0, self.seq)

    def end_write(self) -> None:
        if self.seq % 2:
            self.seq += 1
            SEQ.pack_into(self.map, 0, self.seq)


class PushSlots:
    """A worker's push slots for one shard: a payload goes into a slot whose last payload the shard
    released, or a new one; so the chunks of a push sent back to back each have their own, up to
    MAX_SLOTS: past them a payload goes inline (None), so a burst of chunks (INIT's) costs the worker
    two chunks of memory, not the push."""

    MAX_SLOTS = 2

    def __init__(self, shard: int, *, most: int = MAX_SLOTS):
        self._name = f"push-{shard}"
        self._slots: list[Slot] = []
        self._most = most

    def write(self, payload: memoryview) -> dict | None:
        n = payload.nbytes
        free = [s for s in self._slots if s.free()]
        slot = next((s for s in free if s.size - HEADER >= n), None)
        if slot is None and not free and len(self._slots) >= self._most:
            return None
        if slot is None:
            if free:  # too small: a bigger one in its place
                self._slots.remove(free[0])
                free[0].close()
            slot = Slot(self._name, n)
            self._slots.append(slot)
        return slot.write(payload)

    def trim(self) -> None:
        """Close every slot the shard released but the largest: a burst of chunks (INIT's, a cast push's)
        needed one each, and they would otherwise stay resident for good."""
        free = sorted((s for s in self._slots if s.free()), key=lambda s: s.size)
        for slot in free[:-1]:
            self._slots.remove(slot)
            slot.close()

    def reclaim(self) -> None:
        """The shard accepted a new offer: what it had not read of the earlier payloads it never will
        (it read those queued before the offer first, and refuses a descriptor of a peer it forgot)."""
        for slot in self._slots:
            slot.reclaimed = True

    def __len__(self) -> int:
        return len(self._slots)

    def close(self) -> None:
        for slot in self._slots:
            slot.close()
        self._slots.clear()


def close_map(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a tensor still views it: the mapping goes when that tensor does
        pass


def map_peer(pid: int, fd: int, size: int, ino: int, *, read_only: bool = False) -> mmap.mmap | None:
    """The peer's memfd `fd` mapped here (`read_only`: a write to it faults), or None when it is not a psrv memfd
    of that size and inode."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        if not os.readlink(path).startswith("/memfd:psrv-"):
            return None
        handle = os.open(path, os.O_RDWR)
        try:
            st = os.fstat(handle)
            if st.st_size != size or st.st_ino != ino:
                return None
            return mmap.mmap(handle, size, prot=mmap.PROT_READ) if read_only else mmap.mmap(handle, size)
        finally:
            os.close(handle)
    except OSError:
        return None


def copy(dst: memoryview, src: memoryview) -> None:
    """torch's copy between two byte buffers: with its threads, 4.98 -> 3.74 ms at 64 MB here (a memoryview's
    slice assignment copies on one thread)."""
    if src.nbytes:
        torch.frombuffer(dst, dtype=torch.uint8).copy_(torch.frombuffer(src, dtype=torch.uint8))


def read_descriptor(raw: bytes) -> dict | None:
    """A descriptor's fields, checked for type and range (the place is checked by payload_of); None if bad."""
    try:
        d = msgpack.unpackb(raw, raw=False)
    except Exception:
        return None
    if not isinstance(d, dict) or not all(type(d.get(k)) is int and d[k] >= 0 for k in FIELDS):
        return None
    return d if d["n"] <= d["size"] - HEADER else None


def payload_of(m: mmap.mmap | None, d: dict) -> memoryview | None:
    """The payload `d` names in its mapped memfd `m`, if it is there and still the one written under d's
    sequence number (a later payload in the same slot makes the descriptor stale)."""
    off, n = d.get("off", HEADER), d["n"]
    if m is None or type(off) is not int or not HEADER <= off <= d["size"] - n:
        return None
    if SEQ.unpack_from(m, 0)[0] != d["seq"]:
        return None
    return memoryview(m)[off:off + n]


class Peers:
    """The other side's memfds we mapped, by (key, pid, fd, size, inode); one per key is kept."""

    def __init__(self):
        self._maps: dict[Hashable, tuple[tuple, mmap.mmap]] = {}

    def view(self, key: Hashable, d: dict, *, read_only: bool = False) -> mmap.mmap | None:
        ident = (d["pid"], d["fd"], d["size"], d["ino"])
        held = self._maps.get(key)
        if held is not None and held[0] == ident:
            return held[1]
        self.drop(key)
        m = map_peer(*ident, read_only=read_only)
        if m is not None:
            self._maps[key] = (ident, m)
        return m

    def drop(self, key: Hashable) -> None:
        held = self._maps.pop(key, None)
        if held is not None:
            close_map(held[1])

    def drop_all(self, which) -> None:
        for key in [k for k in self._maps if which(k)]:
            self.drop(key)

    def close(self) -> None:
        self.drop_all(lambda key: True)
