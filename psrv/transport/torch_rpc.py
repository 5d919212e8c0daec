"""torch.distributed.rpc (TensorPipe) transport: the same ShardService behind rpc_async.

A request runs `_serve_request` on the shard's RPC thread, which queues it for the service loop
and returns a future; the loop's reply completes that future, so a deferred reply (a blocked
pull) is just a future completed later. The msgpack header travels as bytes and the tensor as a
torch tensor (TensorPipe moves it without pickling); RPC pickles everything else, so this
transport is for trusted networks only (docs/transports.md). Who is who: psrv.transport.rpc_world.
A replicated shard's primary and backups talk the same way, each as the other's client (RpcLink, made
by RpcServer.link), and a worker is redirected to a backup by its name in the world.
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Any, Hashable, Sequence

import torch
import torch.distributed.rpc as rpc

from psrv.transport.base import ClientTransport, ServerTransport
from psrv.transport.rpc_world import (RpcWorld, join, leave, member_of, parse_addresses, parse_master,
                                      place_backup, place_worker)

log = logging.getLogger("psrv.transport.rpc")
INIT_TIMEOUT = 120.0     # seconds for every member of the world to join
SHUTDOWN_TIMEOUT = 60.0  # seconds per stage of the graceful-shutdown barrier (RPC's own default timeout)
# A request itself has no RPC timeout: a blocked pull may wait long; PSClient's timeout decides, as over zmq.

# RPC calls a function by its qualified name, so the one endpoint per process is found here.
_ENDPOINTS: dict[str, RpcServer] = {}


# --- frames <-> RPC arguments -----------------------------------------------------------------
def _pack(frames: Sequence[Any]) -> tuple[bytes, torch.Tensor | list[torch.Tensor] | None]:
    """(header bytes, raw buffer as a uint8 tensor sharing its memory; a list of them for a message of
    several raw frames, a compressed push) -- TensorPipe moves the tensors unpickled, reading them
    after the call returns."""
    header = bytes(frames[0])
    if len(frames) < 2:
        return header, None
    payloads = [_raw(f) for f in frames[1:]]
    return header, payloads[0] if len(payloads) == 1 else payloads


def _raw(frame: Any) -> torch.Tensor:
    buf = memoryview(frame).cast("B")
    if buf.readonly:  # bytes (a replication message's header, a shard's state): torch views writable memory only
        buf = memoryview(bytearray(buf))
    return torch.frombuffer(buf, dtype=torch.uint8) if buf.nbytes else torch.empty(0, dtype=torch.uint8)


def _unpack(header: bytes, payload: torch.Tensor | list[torch.Tensor] | None) -> list:
    """Frames again, as the codec expects them: [header, raw buffer...]."""
    if payload is None:
        return [memoryview(header)]
    payloads = payload if isinstance(payload, list) else [payload]
    return [memoryview(header), *(memoryview(p.contiguous().numpy()).cast("B") for p in payloads)]


@rpc.functions.async_execution
def _serve_request(server: str, header: bytes, payload: torch.Tensor | list[torch.Tensor] | None) -> torch.futures.Future:
    """Runs on the shard's RPC thread: hand the request to the service loop, reply when it answers."""
    endpoint = _ENDPOINTS.get(server)
    if endpoint is None:
        fut = torch.futures.Future()
        fut.set_exception(RuntimeError(f"{server} is not serving (closed, or not a server)"))
        return fut
    return endpoint._arrive(header, payload)


# --- the two ends ------------------------------------------------------------------------------
def _no_curve(curve_keys: str) -> None:
    if curve_keys:
        raise ValueError("--curve-keys secures the zmq transport only; torch RPC has no authentication "
                         "or encryption: use --transport zmq, or rpc on a trusted network without keys")


class RpcServer(ServerTransport):
    """A shard in the RPC world; `bind` is rpc://HOST:PORT, the rendezvous (shard 0 hosts it).

    The shard joins the world on its first recv(), i.e. once its service is ready to answer:
    workers blocked in their own join start only then, as zmq workers start after the ready file.
    `replicas`: backups per shard in the world (psrv/transport/rpc_world.py). A `backup` (psrv serve
    --backup-of) joins when made instead: its name, backup-<shard>-<j>, and so its address, are claimed
    at the rendezvous; its requests wait in the inbox until its service reads them.
    """

    # A backup over RPC waits as long for its primary as the primary waits for its acks (psrv/timeouts.py
    # ack_timeout): on 2 busy cores the ops and pings of a live primary to a backup that had just joined
    # reached it more than 1.5 s late, and at ZeroMQ's 1 s the backup took over a primary nobody had killed.
    silence_tolerance = 5.0

    def __init__(self, bind: str, *, shard: int = 0, num_shards: int = 1, workers: int = 1, replicas: int = 0,
                 backup: bool = False, max_message_bytes: int = -1, init_timeout: float = INIT_TIMEOUT,
                 shutdown_timeout: float = SHUTDOWN_TIMEOUT, curve_keys: str = ""):
        _no_curve(curve_keys)
        self._world = RpcWorld(parse_master(bind), num_shards, workers, None if backup else replicas)
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard must be in [0, {num_shards}); got {shard}")
        self.shard = shard
        self._rank = shard
        self.name = self._world.name(shard)
        self.address = self._world.address(shard)
        self._max_bytes = max_message_bytes
        self._timeouts = (init_timeout, shutdown_timeout)
        self._joined = False
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: dict[int, torch.futures.Future] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._snapshot: tuple[tuple[int, int], torch.Tensor] | None = None
        if backup:
            self._world, self._rank = place_backup(self._world, shard, timeout=init_timeout)
            self.name = self._world.name(self._rank)
            self.address = self._world.address_of(self.name)
            self._join()

    def _join(self) -> None:
        if self.name in _ENDPOINTS:
            raise RuntimeError(f"this process already serves {self.name}: one RPC endpoint per process")
        _ENDPOINTS[self.name] = self  # before joining: requests may come the moment the world forms
        try:
            join(self._world, self._rank, init_timeout=self._timeouts[0], shutdown_timeout=self._timeouts[1])
        except BaseException:
            _ENDPOINTS.pop(self.name, None)
            raise
        self._joined = True

    def link(self, address: str) -> ClientTransport:
        """A line to another replica of this shard (the replication stream, psrv/server/replication/primary.py), over
        this process's place in the RPC world."""
        return RpcLink(member_of(address))

    def _arrive(self, header: bytes, payload: torch.Tensor | list[torch.Tensor] | None) -> torch.futures.Future:
        fut = torch.futures.Future()
        size = len(header) + sum(p.numel() for p in (payload if isinstance(payload, list) else [payload])
                                 if p is not None)
        if 0 < self._max_bytes < size:
            fut.set_exception(ValueError(f"{self.name}: a message of {size} bytes exceeds {self._max_bytes}"))
            return fut
        token = next(self._ids)
        with self._lock:
            self._waiting[token] = fut
        self._inbox.put((token, _unpack(header, payload)))
        return fut

    def recv(self, timeout: float) -> tuple[Hashable, list] | None:
        if not self._joined:
            self._join()
        try:
            return self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def send(self, peer: Hashable, frames: Sequence[Any]) -> None:
        with self._lock:
            fut = self._waiting.pop(peer, None)
        if fut is None:
            log.debug("%s: reply to unknown request %r dropped", self.name, peer)
            return
        header, payload = _pack(frames)
        copied = len(frames) == 2 and memoryview(frames[1]).readonly  # bytes, which _raw copied: the reply's own
        if isinstance(payload, torch.Tensor) and payload.numel() and not copied:  # the weights; a message of
            payload = self._snapshot_of(payload)  # several parts (a compressed pull's) is made for its reply alone
        fut.set_result((header, payload))

    def _snapshot_of(self, payload: torch.Tensor) -> torch.Tensor:
        """A copy TensorPipe may read while the weights change; one per version, shared by its replies
        (the caller calls wait_sent() before it modifies a buffer it sent, which ends the version)."""
        key = (payload.data_ptr(), payload.numel())
        if self._snapshot is None or self._snapshot[0] != key:
            self._snapshot = (key, payload.clone())
        return self._snapshot[1]

    def wait_sent(self, timeout: float = 30.0) -> bool:
        self._snapshot = None  # replies already hold their copy: the buffer may change at once
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():  # an unanswered request must not hold the shutdown barrier
            fut.set_exception(RuntimeError(f"{self.name} closed before answering"))
        if self._joined:
            _ENDPOINTS.pop(self.name, None)
            leave(self._world, self.name, graceful=True, timeout=self._timeouts[1])


def _failure(result: Any) -> str | None:
    """What went wrong with a finished request, in one line; None when `result` is a reply."""
    if not isinstance(result, BaseException):
        return None
    return str(result).splitlines()[0] if str(result) else type(result).__name__


def _result(fut: torch.futures.Future) -> Any:
    try:
        return fut.value()
    except RuntimeError as exc:  # an error may come back raised or as a value
        return exc


class RpcLink(ClientTransport):
    """One replica's line to another (`peer`, a member's name), for the replication stream: requests and
    their replies as RpcClient's, on the RPC agent this process joined as a server. A request that fails
    (the peer died, or left) is dropped, as ZeroMQ drops one to a silent peer: the replication decides
    what silence means (an ack not come, a primary not heard)."""

    def __init__(self, peer: str):
        self.peer = peer
        self._done: queue.Queue = queue.Queue()

    def send(self, shard: int, frames: Sequence[Any]) -> None:
        header, payload = _pack(frames)
        fut = rpc.rpc_async(self.peer, _serve_request, args=(self.peer, header, payload), timeout=0)
        fut.add_done_callback(self._done.put)

    def recv(self, timeout: float) -> tuple[int, list] | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fut = self._done.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            result = _result(fut)
            failure = _failure(result)
            if failure is None:
                return 0, _unpack(*result)
            log.debug("a request to %s failed: %s", self.peer, failure)

    def reconnect(self, shard: int) -> None:
        """Nothing to do: TensorPipe keeps one pipe per peer."""

    def close(self) -> None:
        """Nothing to release: the RPC agent is the server transport's, which leaves the world."""


class RpcClient(ClientTransport):
    """A worker in the RPC world; addresses are rpc://HOST:PORT/server-<i>, in shard order.

    In a world with backups (its replicas per shard read at the rendezvous), a request that fails because
    its shard died is dropped, as ZeroMQ drops one: the client's probes then find the shard's backup
    (psrv/client/roundtrip.py, `redirect`). Without backups it is a ConnectionError at once."""

    def __init__(self, addresses: Sequence[str], *, worker: int = 0, world_size: int = 1,
                 init_timeout: float = INIT_TIMEOUT, shutdown_timeout: float = SHUTDOWN_TIMEOUT,
                 curve_keys: str = "", curve_name: str = ""):
        _no_curve(curve_keys)
        world = RpcWorld(parse_addresses(addresses), len(addresses), world_size, None)
        if not 0 <= worker < world_size:
            raise ValueError(f"worker rank must be in [0, {world_size}); got {worker}")
        world, rank = place_worker(world, worker, timeout=init_timeout)
        self._world = world
        self._servers = [world.name(s) for s in range(world.servers)]
        self.name = world.name(rank)
        self._shutdown_timeout = shutdown_timeout
        self._done: queue.Queue = queue.Queue()
        self._inflight = 0
        self._lock = threading.Lock()
        self._closed = False
        join(world, rank, init_timeout=init_timeout, shutdown_timeout=shutdown_timeout)

    def send(self, shard: int, frames: Sequence[Any]) -> None:
        header, payload = _pack(frames)  # no copy: the caller keeps the buffer until the reply
        with self._lock:
            self._inflight += 1
        peer = self._servers[shard]
        fut = rpc.rpc_async(peer, _serve_request, args=(peer, header, payload),
                            timeout=0)  # no RPC timeout: see SHUTDOWN_TIMEOUT
        fut.add_done_callback(lambda f, s=shard: self._finished(s, peer, f))

    def _finished(self, shard: int, peer: str, fut: torch.futures.Future) -> None:
        with self._lock:
            self._inflight -= 1
        self._done.put((shard, peer, fut))

    def recv(self, timeout: float) -> tuple[int, list] | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                shard, peer, fut = self._done.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            result = _result(fut)
            failure = _failure(result)
            if failure is None:
                return shard, _unpack(*result)
            if not self._world.replicas:
                raise ConnectionError(f"{self.name}: request to {peer} failed: {failure}")
            log.info("%s: a request to %s failed (%s); its shard's replicas are tried", self.name, peer, failure)

    def reconnect(self, shard: int) -> None:
        """Nothing to do: TensorPipe keeps one pipe per peer and reports a lost peer on the future."""

    def replicas(self, shard: int) -> list[str]:
        """`shard`'s backups, named by the world's shape whether or not they follow their primary yet."""
        w = self._world
        return [w.address_of(w.name(w.backup_rank(shard, j))) for j in range(1, (w.replicas or 0) + 1)]

    def redirect(self, shard: int, address: str) -> None:
        """Send `shard`'s requests to the replica at `address` (rpc://HOST:PORT/backup-I-J, from WELCOME)."""
        self._servers[shard] = member_of(address)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            inflight = self._inflight
        if inflight:  # a request still out would hold a graceful shutdown until it times out
            log.warning("%s: %d request(s) unanswered; leaving the RPC world without the barrier",
                        self.name, inflight)
        leave(self._world, self.name, graceful=not inflight, timeout=self._shutdown_timeout)
