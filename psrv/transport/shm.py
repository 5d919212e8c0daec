"""The shared-memory plane: tensors between a worker and a shard on the same host, one memcpy each way.

Each side owns what it writes (the memfds and their headers: psrv/transport/shm_memory.py). A worker
copies a push that is not its shared gradient into a push slot, a memfd of its own; the shard reads the
push in place (its gradient is a view of the slot, no copy). A push from the shared gradient (share) is
read in place there. The shard copies the weights it answers with into that worker's pull slot, a memfd
of its own, or names their place in its shared weights; the worker copies them from there into its
weights buffer (straight into it when the client says where: receive_into). A side maps the other's
memfd through /proc/PID/fd/FD, so nothing is named in /dev/shm and nothing is left behind: a memfd
lives as long as a process holds it.

Reads are consistent by construction and checked. Every memfd's header holds its writer's sequence
number, made odd while it writes and even after (a sequence lock), and a descriptor says which even
number its payload was written under. A shard writes a pull slot only when it answers that worker; a
worker that finds another number before or after its copy drops the reply as torn (only a re-sent
request's second answer can overwrite the first), and its retry gets the weights again. A worker writes
a push slot only once the shard has released the payload in it (the shard writes that payload's number
into the header at its next recv, when the service is done with it), so the chunks of a push sent back
to back (psrv/chunking.py) each have a slot of their own: as many slots as payloads in flight. A
descriptor whose slot holds a later payload by the time the shard takes it (a duplicate of a message
already read) is refused: RESET, and the worker's retry goes inline. The shard's weights are written
only once every worker has read the answers it was sent by place (shm_readers.py).

Co-location is proven, not assumed: the offer carries the worker's boot id and pid, and proof that it
comes from that process (psrv/transport/shm_identity.py); the shard accepts only a peer whose connection
comes from loopback (or ipc), on the same boot, whose pid lives in the shard's own network namespace (an
emulated host is a namespace of its own), and maps only memfds named psrv-. A plane that breaks (the
worker restarted) answers RESET and the worker offers again; an offer from a worker the shard knows under
another zmq identity (its connection came back) replaces it.
"""
from __future__ import annotations

import mmap
import os
from typing import Hashable

import msgpack
import numpy as np
import torch

from psrv.transport.plane import MIN_BYTES, ClientPlane, ServerPlane
from psrv.transport.shm_identity import Identity, boot_id, netns, proven, started
from psrv.transport.shm_memory import (HEADER, RELEASED_AT, SEQ, Peers, PushSlots, Region, Slot, close_map,
                                       copy, map_peer, payload_of, read_descriptor)
from psrv.transport.shm_readers import COUNT, Readers

__all__ = ["ShmClientPlane", "ShmServerPlane", "boot_id"]


class ShmClientPlane(ClientPlane):
    name = "shm"

    def __init__(self, *, slots: int = PushSlots.MAX_SLOTS):
        """`slots`: payloads in flight to a shard that each keep a push slot; more go inline."""
        self._identity = Identity()
        self._slots = slots
        self._push: dict[int, PushSlots] = {}
        self._pulls = Peers()
        self._counters: dict[int, tuple] = {}  # shard -> (readers map, my index)
        self._grads: Region | None = None
        self._held: dict[int, tuple] = {}  # shard -> its weights read in place: (map, descriptor, view)

    def share(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s values in a memfd of ours: a push from it is read by the shard in place, no copy."""
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            return tensor
        self._grads = Region(tensor, "grads")
        return self._grads.tensor

    def in_place(self, tensor: torch.Tensor) -> bool:
        """A payload of `tensor` is read by the shard where it lies: it is in the shared gradient, and big
        enough to go by the plane (plane.py MIN_BYTES) rather than inline."""
        return self._grads is not None and tensor.numel() * tensor.element_size() >= MIN_BYTES and \
            self._grads.holds(tensor)

    def idle(self) -> None:
        for slots in self._push.values():
            slots.trim()

    def offer(self, shard: int) -> dict:
        return self._identity.offer()

    def accept(self, shard: int, answer: dict) -> None:
        fields = ("pid", "readers_fd", "readers_size", "readers_ino", "index")
        if all(type(answer.get(k)) is int for k in fields):
            m = map_peer(answer["pid"], answer["readers_fd"], answer["readers_size"], answer["readers_ino"])
            if m is not None:
                self._counters[shard] = (m, answer["index"])
        if shard in self._push:
            self._push[shard].reclaim()

    def put(self, shard: int, payload: memoryview) -> bytes:
        where = None if self._grads is None else self._grads.offset_of(payload)
        if where is not None:
            return msgpack.packb(self._grads.describe(where, payload.nbytes))
        slots = self._push.get(shard)
        if slots is None:
            slots = self._push[shard] = PushSlots(shard, most=self._slots)
        written = slots.write(payload)
        return None if written is None else msgpack.packb(written)

    def take(self, shard: int, descriptor: bytes, into: memoryview | None, *, hold: bool = False) -> memoryview | None:
        d = read_descriptor(descriptor)
        if d is None:
            return None
        if hold and type(d.get("reader")) is int:
            return self._hold(shard, d)
        try:
            return self._read(shard, d, into)
        finally:
            if type(d.get("reader")) is int:
                self._done(shard, d["reader"])

    def _read(self, shard: int, d: dict, into: memoryview | None) -> memoryview | None:
        m = self._pulls.view(("weights" if "reader" in d else "pull", shard), d)
        src = payload_of(m, d)  # None: already overwritten by a later answer
        if src is None:
            return None
        out = into if into is not None and into.nbytes == src.nbytes else memoryview(bytearray(src.nbytes))
        copy(out, src)
        if SEQ.unpack_from(m, 0)[0] != d["seq"]:
            return None  # overwritten while we copied: torn
        return out

    def _hold(self, shard: int, d: dict) -> memoryview | None:
        """The shard's weights where they lie, mapped read-only (a write faults), and held: the shard writes them
        only once release(shard) says this worker is done with them (shm_readers.py)."""
        self.release(shard)  # an earlier answer's (the first answer to a re-sent request)
        m = self._pulls.view(("weights-ro", shard), d, read_only=True)
        src = payload_of(m, d)
        if src is None:
            self._done(shard, d["reader"])
            return None
        self._held[shard] = m, d, src
        return src

    def release(self, shard: int) -> bool:
        """Say we are done with the weights held from `shard`; False if they changed while held (the shard gave
        up waiting for us: we were counted out, or slower than its reader timeout)."""
        held = self._held.pop(shard, None)
        if held is None:
            return True
        m, d, _ = held
        intact = SEQ.unpack_from(m, 0)[0] == d["seq"]
        self._done(shard, d["reader"])
        return intact

    def held(self, shard: int) -> int | None:
        held = self._held.get(shard)
        return None if held is None else np.frombuffer(held[2], dtype=np.uint8).ctypes.data

    def _done(self, shard: int, answer: int) -> None:
        """Say we finished with the shard's `answer`-th answer by place (read, or dropped as torn)."""
        counter = self._counters.get(shard)
        if counter is not None:
            m, index = counter
            COUNT.pack_into(m, index * COUNT.size, max(answer, COUNT.unpack_from(m, index * COUNT.size)[0]))

    def reset(self, shard: int) -> None:
        for key in (("weights", shard), ("weights-ro", shard), ("pull", shard)):
            self._pulls.drop(key)
        counter = self._counters.pop(shard, None)
        if counter is not None:
            close_map(counter[0])

    def close(self) -> None:
        for shard in list(self._held):
            self.release(shard)
        self._pulls.close()
        for shard in list(self._counters):
            self.reset(shard)
        for slots in self._push.values():
            slots.close()
        self._push.clear()
        self._identity.close()


def _loopback(address: str) -> bool:
    return address.startswith(("127.", "::1", "localhost")) or address == ""


class ShmServerPlane(ServerPlane):
    name = "shm"

    def __init__(self, *, reader_timeout: float = 1.0):
        self._boot = boot_id()
        self._netns = netns("self")
        self._clients: dict[Hashable, tuple[int, str | None, bytes]] = {}  # peer -> its pid, start, token
        self._pushes = Peers()
        self._pull: dict[Hashable, Slot] = {}
        self._weights: Region | None = None
        self._readers = Readers(timeout=reader_timeout)
        self._taken: tuple[Hashable, mmap.mmap, int] | None = None  # the push slot last handed up: peer, map, seq

    def share(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s values in a memfd of ours: answers that send it give its place instead of a copy."""
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            return tensor
        self._weights = Region(tensor)
        return self._weights.tensor

    def answer(self, peer: Hashable, offer: dict, *, peer_address: str) -> dict | None:
        pid = offer.get("pid")
        if offer.get("boot") != self._boot or type(pid) is not int or not _loopback(peer_address):
            return None
        try:
            if netns(pid) != self._netns:
                return None
        except OSError:
            return None
        if not proven(offer):  # the offer comes from the process it names
            return None
        self._sweep()
        me = pid, started(pid), offer["token"]
        for old in [p for p, who in self._clients.items() if who == me and p != peer]:
            self.forget(old)  # the same worker plane, reconnected: a new zmq identity
        self._clients[peer] = me
        return {"pid": os.getpid(), **self._readers.join(peer)}

    def take(self, peer: Hashable, descriptor: bytes) -> memoryview | None:
        self.released()
        d = read_descriptor(descriptor)
        if d is None or self._clients.get(peer, (None,))[0] != d["pid"]:
            return None
        m = self._pushes.view((peer, d["fd"]), d)
        payload = payload_of(m, d)  # None: a stale descriptor (its slot holds a later payload): RESET
        if payload is not None and "off" not in d:
            self._taken = peer, m, d["seq"]
        return payload

    def released(self) -> None:
        """The payload handed up last is no longer read (the transport's next recv): its push slot may
        take the worker's next one."""
        if self._taken is not None:
            _, m, seq = self._taken
            self._taken = None
            try:
                SEQ.pack_into(m, RELEASED_AT, seq)
            except ValueError:  # unmapped meanwhile
                pass

    def put(self, peer: Hashable, payload: memoryview) -> bytes | None:
        if peer not in self._clients:
            return None
        region = self._weights
        where = None if region is None else region.offset_of(payload)
        if where is not None and self._readers.counts(peer):  # the weights: read in place, and said when done
            return msgpack.packb(region.describe(where, payload.nbytes, reader=self._readers.sent(peer)))
        slot = self._pull.get(peer)
        if slot is None or slot.size - HEADER < payload.nbytes:
            if slot is not None:
                slot.close()
            slot = self._pull[peer] = Slot("pull", payload.nbytes)
        return msgpack.packb(slot.write(payload))

    def writing(self) -> None:
        """Wait until every worker has read the weights it was sent, then mark them being written."""
        self._readers.wait()
        if self._weights is not None:
            self._weights.begin_write()

    def written(self) -> None:
        if self._weights is not None:
            self._weights.end_write()

    def _sweep(self) -> None:
        """Forget the peers whose process is gone (a worker that restarted, or vanished): the mappings of
        its memfds would keep its memory alive. Done at each offer, as a restarted worker makes one."""
        for peer in [p for p, (pid, start, _) in self._clients.items() if started(pid) != start]:
            self.forget(peer)

    def forget(self, peer: Hashable) -> None:
        if self._taken is not None and self._taken[0] == peer:  # (at a recv: the service is done with it)
            self.released()
        self._clients.pop(peer, None)
        self._readers.leave(peer)
        self._pushes.drop_all(lambda key: key[0] == peer)
        slot = self._pull.pop(peer, None)
        if slot is not None:
            slot.close()

    def close(self) -> None:
        self.released()
        for peer in list(self._clients):
            self.forget(peer)
        self._pushes.close()
        self._readers.close()
