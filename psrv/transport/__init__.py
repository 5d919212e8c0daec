"""Transports, chosen by name: nothing outside this package imports zmq or torch RPC.

The factories import an implementation only when it is asked for, so `zmq` and `rpc` each import
the interface (psrv.transport.base) and never each other or this package's factories.
"""
from __future__ import annotations

from typing import Any, Sequence

from psrv.config import TRANSPORTS
from psrv.config.address_form import check_address, schemes_of
from psrv.transport.base import ClientTransport, ServerTransport

__all__ = ["TRANSPORTS", "ClientTransport", "ServerTransport", "create_client", "create_server"]


def _check(name: str) -> None:
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORTS)}")


def create_server(name: str, bind: str, *, shard: int = 0, num_shards: int = 1, workers: int = 1,
                  shared_memory: bool = False, bulk: bool = False, **options: Any) -> ServerTransport:
    """A bound server transport; `bind` like tcp://127.0.0.1:0 (0 = a free port), or rpc://HOST:PORT
    (the rendezvous). The shard's place in the job (shard, num_shards, workers) names it in an RPC world.
    zmq only: `shared_memory` and `bulk` accept those payload planes (psrv/transport/plane.py) when
    a worker offers them. A malformed `bind`, or one of the other transport's form, is a ValueError before
    anything binds (zmq would cut a port beyond 65535 to its low 16 bits and serve there)."""
    _check(name)
    bind = check_address(bind, option="bind", bind=True, schemes=schemes_of(name))
    if name == "zmq":
        from psrv.transport.zmq import ZmqServer
        return ZmqServer(bind, planes=_server_planes(shared_memory, bulk, bind, options),
                         link_planes=lambda: _link_planes(shared_memory), **options)
    from psrv.transport.torch_rpc import RpcServer
    return RpcServer(bind, shard=shard, num_shards=num_shards, workers=workers, **options)


def create_client(name: str, addresses: Sequence[str], *, worker: int = 0, world_size: int = 1,
                  shared_memory: bool = False, bulk: bool = False, watch: bool = False,
                  **options: Any) -> ClientTransport:
    """A client transport connected to every shard address, in shard order; `worker` of `world_size`
    names it in an RPC world (zmq needs no names). zmq only: `shared_memory` and `bulk` offer those
    payload planes to every shard, which picks one or none; `watch` tells when a shard's connection breaks
    (ClientTransport.down)."""
    _check(name)
    if name == "zmq":
        from psrv.transport.zmq import ZmqClient
        return ZmqClient(addresses, planes=_client_planes(shared_memory, bulk, addresses), watch=watch, **options)
    from psrv.transport.torch_rpc import RpcClient
    return RpcClient(addresses, worker=worker, world_size=world_size, **options)


def _server_planes(shared_memory: bool, bulk: bool, bind: str, options: dict) -> list:
    planes = []
    if shared_memory:  # preferred: co-located peers only, and it copies least
        from psrv.transport.shm import ShmServerPlane
        planes.append(ShmServerPlane())
    if bulk:
        from psrv.transport.bulk import BulkServerPlane
        planes.append(BulkServerPlane(bind, max_bytes=options.get("max_message_bytes", -1)))  # on the bind's host
    return planes


LINK_SLOTS = 4  # forwarded payloads in flight to a backup on this host that each keep a slot (the rest go inline)


def _link_planes(shared_memory: bool) -> list:
    """A replica link's planes (ZmqServer.link): shared memory to a backup on this host, where the shard takes it
    from its workers; more slots than a worker's, as a primary forwards a push's chunks back to back."""
    if not shared_memory:
        return []
    from psrv.transport.shm import ShmClientPlane
    return [ShmClientPlane(slots=LINK_SLOTS)]


def _client_planes(shared_memory: bool, bulk: bool, addresses: Sequence[str]) -> list:
    planes = []
    if shared_memory:
        from psrv.transport.shm import ShmClientPlane
        planes.append(ShmClientPlane())
    if bulk:
        from psrv.transport.bulk import BulkClientPlane
        planes.append(BulkClientPlane(addresses))  # connects to each shard's zmq host
    return planes
