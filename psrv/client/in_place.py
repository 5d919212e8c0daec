"""The worker's side of pull_in_place (psrv/config/worker_settings.py): the weights a co-located shard answers with
are not copied into the worker's buffer but read where they lie, in the shard's shared memory, mapped read-only
(psrv/transport/shm.py `ShmClientPlane._hold`), and the model computes on them there.

They stay held from the answer until this worker's next request to that shard: the shard waits for every worker
that holds them before it writes them (psrv/transport/shm_readers.py), and in sync without backup workers or a
quorum it writes them only after every worker's push anyway (its WELCOME's `pull_in_place` says it is such a
shard). A push whose weights changed while held (the shard counted this worker out of its clock and went on) is
not sent: it was computed on weights that were being written, and RuntimeError says so.

Where the answer comes another way (a shard on another host, a reply that went inline, a plane that broke), it
is copied into the caller's buffer as before; `read` and `copied` count each."""
from __future__ import annotations

import logging

import torch

from psrv.protocol import Message

log = logging.getLogger("psrv.client.in_place")


class InPlacePulls:
    """`wanted`: the worker's pull_in_place; `on` once hello() found every condition met (`welcomed`)."""

    def __init__(self, net, *, wanted: bool, worker: int):
        self.net, self.wanted, self.worker = net, wanted, worker
        self.on = False
        self.read = 0    # answers read in place
        self.copied = 0  # answers copied although wanted in place

    def welcomed(self, welcomes: list[dict], *, shards: int, compressed_pulls: bool) -> None:
        """Whether this client reads its pulls in place, from the shards' WELCOMEs; a warning says why not."""
        if not self.wanted:
            return
        why = ""
        if shards != 1:
            why = f"the model lies in {shards} shards' memory; needs one"
        elif compressed_pulls:
            why = "a compressed pull sends changes, not the weights"
        elif not all(w.get("pull_in_place") for w in welcomes):
            why = f"the shard is in mode {welcomes[0].get('mode')!r} with other workers, or has backup workers or a quorum"
        self.on = not why
        if why:
            log.warning("worker %d: pull_in_place is off: %s; each pull copies the weights", self.worker, why)

    def hint(self, on: bool) -> None:
        """While a round trip that brings weights runs: the shard's answer by place is held where it lies."""
        if self.on:
            self.net.read_in_place(0, on)

    def weights(self, shard: int, reply: Message) -> torch.Tensor | None:
        """`reply`'s weights where they lie in the shard's memory when it was read in place (held); None when it
        came another way (the caller copies it)."""
        if not self.on:
            return None
        address = self.net.held(shard)
        if address is not None and reply.tensor is not None and reply.tensor.data_ptr() == address:
            self.read += 1
            return reply.tensor
        self.copied += 1
        return None

    def release(self, shard: int, *, pushing: bool) -> None:
        """Before a request to `shard` goes: done with its weights. Raises RuntimeError before a push computed on
        weights that changed while held."""
        if self.on and not self.net.release(shard) and pushing:
            raise RuntimeError(
                f"worker {self.worker}: shard {shard} wrote its weights while this worker computed on them in "
                "place (it counted this worker out of its clock, or waited for it longer than its reader timeout); "
                "the gradient is not pushed. pull_in_place off copies each pull instead")
