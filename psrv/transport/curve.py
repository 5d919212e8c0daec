"""CURVE keys for the ZeroMQ transport: `psrv keygen DIR` makes them; servers and workers load them.

DIR/server.key(_secret) is the servers' pair; DIR/worker-K.key(_secret) and DIR/admin.key(_secret)
are the clients'. A server admits exactly the clients whose public key (*.key, server.key aside)
is in DIR: remove a client's .key file to revoke it. Copy to a worker host only server.key and
that worker's pair.
"""
from __future__ import annotations

import os
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

SERVER = "server"


def keygen(directory: str | Path, *, workers: int, names: tuple[str, ...] = ("admin",)) -> list[Path]:
    """Make the server pair plus one pair per worker (worker-0 ...) and per extra name."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    made = []
    for name in (SERVER, *(f"worker-{r}" for r in range(workers)), *names):
        if (d / f"{name}.key_secret").exists():
            raise ValueError(f"{d / name}.key_secret exists; keygen never overwrites keys (use another DIR)")
        public, secret = zmq.auth.create_certificates(d, name)
        os.chmod(secret, 0o600)
        made += [Path(public), Path(secret)]
    return made


def _pair(path: Path) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load CURVE key {path}: {exc} (make keys with `psrv keygen DIR`)") from None
    if secret is None:
        raise ValueError(f"{path} holds no secret key")
    return public, secret


def server_pair(directory: str | Path) -> tuple[bytes, bytes]:
    return _pair(Path(directory) / f"{SERVER}.key_secret")


def client_keys(directory: str | Path, name: str) -> tuple[bytes, bytes, bytes]:
    """(server public key, client public key, client secret key) for client `name`."""
    d = Path(directory)
    try:
        server_public, _ = zmq.auth.load_certificate(d / f"{SERVER}.key")
    except (OSError, ValueError):
        raise ValueError(f"no usable {d / SERVER}.key: copy the servers' public key there") from None
    return (server_public, *_pair(d / f"{name}.key_secret"))


def allowed_keys(directory: str | Path) -> set[bytes]:
    """Z85 public keys of every admitted client."""
    keys = set()
    for path in sorted(Path(directory).glob("*.key")):
        if path.stem != SERVER:
            public, _ = zmq.auth.load_certificate(path)
            keys.add(public)
    return keys


class _AllowList:
    def __init__(self, keys: set[bytes]):
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


def start_authenticator(ctx: zmq.Context, directory: str | Path) -> ThreadAuthenticator:
    """A ZAP handler on `ctx` admitting only the allow-listed CURVE clients."""
    keys = allowed_keys(directory)
    if not keys:
        raise ValueError(f"no client public keys (*.key) in {directory}: nobody could connect")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_AllowList(keys))
    return auth
