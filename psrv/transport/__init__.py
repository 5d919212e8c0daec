"""Transports, chosen by name: nothing outside this package imports zmq or torch RPC."""
from psrv.transport.base import ClientTransport, ServerTransport, create_client, create_server

__all__ = ["ClientTransport", "ServerTransport", "create_client", "create_server"]
