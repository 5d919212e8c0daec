"""The admin client: one STATS, CHECKPOINT or SHUTDOWN sent to one shard, outside any worker's session
(`psrv admin`, and tests that ask a running shard). A worker's own requests go through PSClient
(psrv/client/psclient.py)."""
from __future__ import annotations

from psrv.protocol import ErrorCode, Message, MsgType, decode, encode
from psrv.transport import create_client
from psrv.client.roundtrip import PSError


def admin_request(address: str, kind: MsgType, *, curve_keys: str = "", name: str = "admin",
                  timeout: float = 10.0, transport: str = "zmq") -> dict:
    """One STATS, CHECKPOINT or SHUTDOWN to one shard; its answer's fields (PSError on ERROR).

    CHECKPOINT and SHUTDOWN need a server started with --curve-keys and the client key `name`."""
    options = {"curve_keys": curve_keys, "curve_name": name} if curve_keys else {}
    net = create_client(transport, [address], **options)
    try:
        net.send(0, encode(Message(kind, seq=1)))
        got = net.recv(timeout)
        if got is None:
            raise TimeoutError(f"no answer from {address} within {timeout:.0f}s to {kind.name}")
        reply = decode(got[1])
    finally:
        net.close()
    if reply.type is MsgType.ERROR:
        raise PSError(0, reply.fields.get("code", ErrorCode.INTERNAL), reply.fields.get("message", ""))
    return reply.fields
