"""torch.distributed.rpc (TensorPipe) transport: the same ShardService behind rpc_async.

A request runs `_serve_request` on the shard's RPC thread, which queues it for the service loop
and returns a future; the loop's reply completes that future, so a deferred reply (a blocked
pull) is just a future completed later. The msgpack header travels as bytes and the tensor as a
torch tensor (TensorPipe moves it without pickling); RPC pickles everything else, so this
transport is for trusted networks only (docs/transports.md). Who is who: psrv.transport.rpc_world.
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Any, Hashable, Sequence

import torch
import torch.distributed.rpc as rpc

from psrv.transport.base import ClientTransport, ServerTransport
from psrv.transport.rpc_world import RpcWorld, join, leave, parse_addresses, parse_master

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
    """

    def __init__(self, bind: str, *, shard: int = 0, num_shards: int = 1, workers: int = 1,
                 max_message_bytes: int = -1, init_timeout: float = INIT_TIMEOUT,
                 shutdown_timeout: float = SHUTDOWN_TIMEOUT, curve_keys: str = ""):
        _no_curve(curve_keys)
        self._world = RpcWorld(parse_master(bind), num_shards, workers)
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard must be in [0, {num_shards}); got {shard}")
        self.shard = shard
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

    def _join(self) -> None:
        if self.name in _ENDPOINTS:
            raise RuntimeError(f"this process already serves {self.name}: one RPC endpoint per process")
        _ENDPOINTS[self.name] = self  # before joining: requests may come the moment the world forms
        try:
            join(self._world, self.shard, init_timeout=self._timeouts[0], shutdown_timeout=self._timeouts[1])
        except BaseException:
            _ENDPOINTS.pop(self.name, None)
            raise
        self._joined = True

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
        if isinstance(payload, torch.Tensor) and payload.numel():  # the weights; a message of several parts
            payload = self._snapshot_of(payload)  # (a compressed pull's) is made for its reply alone
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


class RpcClient(ClientTransport):
    """A worker in the RPC world; addresses are rpc://HOST:PORT/server-<i>, in shard order."""

    def __init__(self, addresses: Sequence[str], *, worker: int = 0, world_size: int = 1,
                 init_timeout: float = INIT_TIMEOUT, shutdown_timeout: float = SHUTDOWN_TIMEOUT,
                 curve_keys: str = "", curve_name: str = ""):
        _no_curve(curve_keys)
        self._world = world = RpcWorld(parse_addresses(addresses), len(addresses), world_size)
        if not 0 <= worker < world_size:
            raise ValueError(f"worker rank must be in [0, {world_size}); got {worker}")
        self._servers = [world.name(s) for s in range(world.servers)]
        self.name = world.name(world.servers + worker)
        self._shutdown_timeout = shutdown_timeout
        self._done: queue.Queue = queue.Queue()
        self._inflight = 0
        self._lock = threading.Lock()
        self._closed = False
        join(world, world.servers + worker, init_timeout=init_timeout, shutdown_timeout=shutdown_timeout)

    def send(self, shard: int, frames: Sequence[Any]) -> None:
        header, payload = _pack(frames)  # no copy: the caller keeps the buffer until the reply
        with self._lock:
            self._inflight += 1
        fut = rpc.rpc_async(self._servers[shard], _serve_request, args=(self._servers[shard], header, payload),
                            timeout=0)  # no RPC timeout: see SHUTDOWN_TIMEOUT
        fut.add_done_callback(lambda f, s=shard: self._finished(s, f))

    def _finished(self, shard: int, fut: torch.futures.Future) -> None:
        with self._lock:
            self._inflight -= 1
        self._done.put((shard, fut))

    def recv(self, timeout: float) -> tuple[int, list] | None:
        try:
            shard, fut = self._done.get(timeout=timeout)
        except queue.Empty:
            return None
        try:
            result = fut.value()
        except RuntimeError as exc:
            result = exc
        if isinstance(result, BaseException):  # an error may come back raised or as a value
            first = str(result).splitlines()[0] if str(result) else type(result).__name__
            raise ConnectionError(f"{self.name}: request to {self._servers[shard]} failed: {first}")
        return shard, _unpack(*result)

    def reconnect(self, shard: int) -> None:
        """Nothing to do: TensorPipe keeps one pipe per peer and reports a lost peer on the future."""

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
