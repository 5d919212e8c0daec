"""Who offers the shared-memory plane (psrv/transport/shm.py): proof that an offer comes from the process
it names, and what tells that process from another that reuses its pid.

An offer names a pid, whose memfds the shard then maps. So that it can name only its own, the worker's
plane keeps a random token in a memfd of its own (`Identity`) and puts that fd and the token in the offer;
the shard reads /proc/PID/fd/FD and accepts only if it is a psrv-id memfd holding that token
(`proven`). A process learns another's token only by reading that process's memory or fds, which takes
the rights (same user, or root) that would let it map the other's memfds anyway; guessing takes 2**256
tries. The token also tells one worker plane from another in the same process (tests, a user's
threads): a reconnected worker's offer carries its token again, and replaces what the shard kept for
its old zmq identity.
"""
from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

TOKEN_BYTES = 32
NAME = "psrv-id"


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def netns(pid: int | str) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def started(pid: int) -> str | None:
    """When process `pid` started (its /proc stat's starttime), None if it is gone: with the pid, it
    names one process, not whichever reuses the pid later."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Identity:
    """A worker plane's token, in a memfd of its own (what its offers carry)."""

    def __init__(self):
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.fd = os.memfd_create(NAME, os.MFD_CLOEXEC)
        os.write(self.fd, self.token)

    def offer(self) -> dict:
        return {"boot": boot_id(), "pid": os.getpid(), "fd": self.fd, "token": self.token}

    def close(self) -> None:
        os.close(self.fd)


def proven(offer: dict) -> bool:
    """Whether the offer's fd, in the process its pid names, is a psrv-id memfd holding the offer's token."""
    pid, fd, token = offer.get("pid"), offer.get("fd"), offer.get("token")
    if type(pid) is not int or type(fd) is not int or pid <= 0 or fd < 0 or not isinstance(token, bytes) \
            or len(token) != TOKEN_BYTES:
        return False
    path = f"/proc/{pid}/fd/{fd}"
    try:
        if not os.readlink(path).startswith(f"/memfd:{NAME} "):
            return False
        handle = os.open(path, os.O_RDONLY)
        try:
            held = os.pread(handle, TOKEN_BYTES + 1, 0) if os.fstat(handle).st_size == TOKEN_BYTES else b""
        finally:
            os.close(handle)
    except OSError:
        return False
    return hmac.compare_digest(held, token)
