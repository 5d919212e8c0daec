"""The one check of an address's form, for every place a user names a shard: a server's `--bind` (the
config key `bind`, psrv.Server), and the shard addresses a worker, `psrv top` or `psrv admin` is given
(`--servers`, psrv.Worker's `servers=`, PSRV_SERVERS, the config key `servers`).

It runs before any socket is made. ZeroMQ itself says little: an address without `tcp://` is a
25-line ZMQError traceback, and it keeps a port's lowest 16 bits, so `--bind tcp://127.0.0.1:99999`
would serve on port 34463. The forms are what the transports take: ZeroMQ's tcp://HOST:PORT, ipc://PATH
and inproc://NAME, and torch RPC's rpc://HOST:PORT (a bind: the rendezvous) or rpc://HOST:PORT/server-I.
An `@FILE` entry (a server's ready file) is checked by psrv/transport/addresses.py once FILE is read.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

ZMQ_SCHEMES = ("tcp", "ipc", "inproc")
RPC_SCHEMES = ("rpc",)
SCHEMES = ZMQ_SCHEMES + RPC_SCHEMES
_CONNECT_FORMS = {"tcp": "tcp://HOST:PORT", "ipc": "ipc://PATH", "inproc": "inproc://NAME",
                  "rpc": "rpc://HOST:PORT/server-I"}
_BIND_FORMS = {**_CONNECT_FORMS, "rpc": "rpc://HOST:PORT"}
_LISTED = " (comma-separated, in shard order)"
_SHARD_PATH = re.compile(r"/server-[0-9]+")


def schemes_of(transport: str) -> tuple[str, ...]:
    """The address schemes transport `transport` ('zmq' or 'rpc') connects to and binds."""
    return RPC_SCHEMES if transport == "rpc" else ZMQ_SCHEMES


def address_problem(text: str, *, bind: bool = False, schemes: Iterable[str] = SCHEMES,
                    listed: bool = False) -> str | None:
    """What is wrong with address `text` (None: nothing): a server's bind where `bind`, else a shard
    address to connect to. `listed`: the address is one of a comma-separated list, which the hint says."""
    schemes = tuple(schemes)
    forms = _BIND_FORMS if bind else _CONNECT_FORMS
    tail = _LISTED if listed else ""
    scheme, sep, rest = text.partition("://")
    if not sep or not scheme or any(c.isspace() for c in text):
        return f"{text!r} is not an address; write {forms[schemes[0]]}{tail}"
    if scheme not in schemes:
        shown = [forms[s] for s in schemes if s != "inproc"]  # inproc: only a Server in the same process
        return f"{text!r}: {scheme}:// is not a scheme psrv takes here; write {' or '.join(shown)}{tail}"
    form = forms[scheme] + tail
    if scheme in ("ipc", "inproc"):
        return None if rest else f"{text!r} is not an address; write {form}"
    netloc, slash, path = rest.partition("/")
    if scheme == "tcp" and slash:
        return f"{text!r} has a path after its port; write {form}"
    if scheme == "rpc" and (bool(slash) if bind else not _SHARD_PATH.fullmatch(slash + path)):
        return f"{text!r} is not an address; write {form}"
    return _host_port_problem(text, netloc, any_port=bind and scheme == "tcp", form=form)


def _host_port_problem(text: str, netloc: str, *, any_port: bool, form: str) -> str | None:
    """HOST:PORT's problem: no host or no port, a port that is not a number in range, or the any-interface
    host `*` where a connection needs a real one. `any_port` (a zmq bind) also takes port 0 or `*`: a free one."""
    host, sep, port = netloc.rpartition(":")
    if not sep or not host or not port or netloc.endswith("]"):  # [::1] alone: an IPv6 host, no port
        return f"{text!r} needs a host and a port; write {form}"
    if host == "*" and not any_port:
        return f"{text!r}: host * (any interface) is only for a zmq server's --bind; name the server's host"
    if any_port and port == "*":
        return None
    if not (port.isascii() and port.isdigit()):
        return f"{text!r}: port {port!r} is not a number; write {form}"
    low = 0 if any_port else 1
    if not low <= int(port) <= 65535:
        free = " (0: any free port)" if any_port else ""
        return f"{text!r}: port {int(port)} is out of range; a port is {low}..65535{free}"
    return None


def check_address(text: str, *, option: str = "", bind: bool = False, schemes: Iterable[str] = SCHEMES) -> str:
    """`text` stripped where it is a well-formed address; else ValueError, in one line, starting with
    `option` (the flag, keyword or variable that gave it; none for a config setting's own check)."""
    address = text.strip()
    problem = address_problem(address, bind=bind, schemes=schemes)
    if problem:
        raise ValueError(f"{option}: {problem}" if option else problem)
    return address


def check_shard_addresses(entries: Iterable[str], *, option: str = "", schemes: Iterable[str] = SCHEMES,
                          files: bool = True) -> tuple[str, ...]:
    """The non-blank `entries`, stripped, each a well-formed shard address or, where `files`, an `@FILE`
    left for its reader; else ValueError naming `option` and the first bad one, with the form expected."""
    schemes = tuple(schemes)
    out = []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        problem = None if files and entry.startswith("@") else address_problem(entry, schemes=schemes, listed=True)
        if problem:
            raise ValueError(f"{option}: {problem}" if option else problem)
        out.append(entry)
    return tuple(out)
