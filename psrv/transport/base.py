"""The Transport interface (ps-lite's Van): bind/connect, send frames, receive frames.

A frame list is what psrv.protocol.codec makes: a header and at most one raw buffer.
"""
from __future__ import annotations

import abc
from typing import Any, Hashable, Sequence

TRANSPORTS = ("zmq", "rpc")


class ServerTransport(abc.ABC):
    """One shard's endpoint: receives requests from any worker and replies to a peer."""

    address: str  # the address workers connect to (port resolved)

    @abc.abstractmethod
    def recv(self, timeout: float) -> tuple[Hashable, list] | None:
        """Next (peer, frames), or None after `timeout` seconds with nothing."""

    @abc.abstractmethod
    def send(self, peer: Hashable, frames: Sequence[Any]) -> None:
        """Reply to `peer`. Tensor buffers are sent without copying."""

    def wait_sent(self, timeout: float = 30.0) -> bool:
        """Block until every buffer handed to send() may be modified again; False on timeout."""
        return True

    @abc.abstractmethod
    def close(self) -> None: ...


class ClientTransport(abc.ABC):
    """A worker's endpoints, one per shard, addressed by shard index."""

    @abc.abstractmethod
    def send(self, shard: int, frames: Sequence[Any]) -> None: ...

    @abc.abstractmethod
    def recv(self, timeout: float) -> tuple[int, list] | None:
        """Next (shard, frames) from any shard, or None after `timeout` seconds."""

    @abc.abstractmethod
    def reconnect(self, shard: int) -> None:
        """Drop the connection to `shard` and its queued messages, and connect afresh."""

    @abc.abstractmethod
    def close(self) -> None: ...


def _check(name: str) -> None:
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORTS)}")


def create_server(name: str, bind: str, *, shard: int = 0, num_shards: int = 1, workers: int = 1,
                  **options: Any) -> ServerTransport:
    """A bound server transport; `bind` like tcp://127.0.0.1:0 (0 = a free port), or rpc://HOST:PORT
    (the rendezvous). The shard's place in the job (shard, num_shards, workers) names it in an RPC world."""
    _check(name)
    if name == "zmq":
        from psrv.transport.zmq import ZmqServer
        return ZmqServer(bind, **options)
    from psrv.transport.torch_rpc import RpcServer
    return RpcServer(bind, shard=shard, num_shards=num_shards, workers=workers, **options)


def create_client(name: str, addresses: Sequence[str], *, worker: int = 0, world_size: int = 1,
                  **options: Any) -> ClientTransport:
    """A client transport connected to every shard address, in shard order; `worker` of `world_size`
    names it in an RPC world (zmq needs no names)."""
    _check(name)
    if name == "zmq":
        from psrv.transport.zmq import ZmqClient
        return ZmqClient(addresses, **options)
    from psrv.transport.torch_rpc import RpcClient
    return RpcClient(addresses, worker=worker, world_size=world_size, **options)
