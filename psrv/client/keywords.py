"""What psrv.Worker's keywords leave to others, resolved at its construction: the shards' addresses, rank
and world size from the environment where they are not given (PSRV_SERVERS, RANK and WORLD_SIZE, as torchrun
sets the last two; an address `@FILE` waits for a server's ready file), the clip agreed with the shards'
WELCOME, and the payload planes' 'auto'/'off' as PSClient's flags (psrv/client/session.py uses them), and
the all-reduce mode a run asks for (PSRV_MODE); and the keywords psrv.Worker(...) shows (`constructor_signature`)."""
from __future__ import annotations

import inspect
import os
from typing import Sequence

from psrv.config import ALLREDUCE_MODES
from psrv.config.address_form import schemes_of
from psrv.transport.addresses import resolve_addresses


def clip_of(mine: float | None, welcomes: list[dict], mode: str) -> float:
    """The clip this worker's pushes get: its own, else the servers'; ValueError where they differ,
    or where sync's servers (which clip there) would not clip by this worker's."""
    mine = float(mine or 0.0)
    served = {float(w.get("clip_grad_norm") or 0.0) for w in welcomes}
    if len(served) > 1:
        raise ValueError(f"the shards clip by different norms ({', '.join(map(str, sorted(served)))}); "
                         "start them with one --clip-grad-norm")
    theirs = served.pop()
    if mine and mine != theirs and (theirs or mode == "sync"):
        where = " (in sync the servers clip)" if mode == "sync" else ""
        raise ValueError(f"clip_grad_norm={mine:g}, but the servers were started with --clip-grad-norm "
                         f"{theirs:g}{where}; give both the same value")
    return mine or theirs


KEYWORD_OF = {"PSRV_SERVERS": "servers", "RANK": "rank", "WORLD_SIZE": "world_size"}  # variable -> keyword
_SAID_AS = {"servers=": "psrv.Worker(servers=...)", "PSRV_SERVERS": "psrv.Worker: PSRV_SERVERS"}
WHAT_OF = {"PSRV_SERVERS": " (the shards' addresses, tcp://HOST:PORT,..., in shard order)"}


def env(name: str) -> str:
    """The environment's `name`; ValueError, naming the keyword to pass instead (KEYWORD_OF), where it is
    unset or blank."""
    value = os.environ.get(name, "")
    if not value.strip():
        raise ValueError(f"psrv.Worker: pass {KEYWORD_OF[name]}= or set {name} in the environment"
                         f"{WHAT_OF.get(name, '')}")
    return value


def servers_of(given: Sequence[str] | str | None, *, wait: float, transport: str = "zmq") -> list[str]:
    """The shards' addresses: `given` (a list, or one comma-separated string), else PSRV_SERVERS
    (comma-separated, in shard order), each checked for `transport`'s form, a bad one named as the
    keyword or variable that gave it. An entry `@FILE` is read from FILE (a server's --ready-file) once
    it exists, waiting at most `wait` seconds, so the workers may start before the servers (as
    `psrv worker --servers @FILE` may)."""
    where = "servers=" if given is not None else "PSRV_SERVERS"
    if given is None:
        entries = env("PSRV_SERVERS").split(",")
    else:
        entries = given.split(",") if isinstance(given, str) else list(given)
    servers = list(resolve_addresses(entries, wait=wait, option=_SAID_AS[where],
                                     schemes=schemes_of(transport)))
    if not servers:
        raise ValueError(f"psrv.Worker: {where} names no shard address (tcp://host:port,...)")
    return servers


def planes(shared_memory: str, bulk: str, curve_keys: str) -> dict:
    """PSClient's plane flags from the settings' 'auto'/'off' (bulk never under CURVE: it is not encrypted)."""
    for name, value in (("shared_memory", shared_memory), ("bulk", bulk)):
        if value not in ("auto", "off"):
            raise ValueError(f"{name} must be 'auto' or 'off'; got {value!r}")
    return {"shared_memory": shared_memory == "auto", "bulk": bulk == "auto" and not curve_keys}


def allreduce_mode() -> str | None:
    """The all-reduce mode (ddp, fsdp, zero1) a run set in PSRV_MODE, under which psrv.make_worker is the
    all-reduce worker (psrv/client/allreduce.py) and psrv.Worker is refused; None for a parameter-server mode or
    none set."""
    mode = os.environ.get("PSRV_MODE", "").strip()
    return mode if mode in ALLREDUCE_MODES else None


def constructor_signature(cls: type) -> inspect.Signature:
    """cls(...)'s signature as its __init__ declares it (without self)."""
    signature = inspect.signature(cls.__init__)
    return signature.replace(parameters=list(signature.parameters.values())[1:])
