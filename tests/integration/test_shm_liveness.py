"""The shared-memory plane (psrv/transport/shm.py) keeps going around workers that are slow, reconnect or
lie: a reader timeout gives up on the answers outstanding then and no others, and an offer is taken only
from the process it names."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from psrv.transport.shm import ShmClientPlane, ShmServerPlane, boot_id
from tests.integration.test_shm_plane import _pair, _recv, _with_weights

# A process that makes the offer a worker makes (psrv/transport/shm.py's ShmClientPlane.offer), prints
# it, and lives on: without importing torch, so it starts in milliseconds.
OTHER_WORKER = """
import os, secrets, sys, time
fd = os.memfd_create("psrv-id", os.MFD_CLOEXEC)
token = secrets.token_bytes(32)
os.write(fd, token)
print(fd, token.hex(), flush=True)
time.sleep(60)
"""


def other_worker() -> tuple[subprocess.Popen, dict]:
    """Another live process with a worker's proof of who it is; (process, its offer)."""
    p = subprocess.Popen([sys.executable, "-c", OTHER_WORKER], stdout=subprocess.PIPE, text=True)
    fd, token = p.stdout.readline().split()
    return p, {"boot": boot_id(), "pid": p.pid, "fd": int(fd), "token": bytes.fromhex(token)}


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.numpy()).cast("B")


@pytest.mark.timeout(30)
def test_a_reader_timeout_gives_up_on_the_answers_outstanding_then_and_the_shard_waits_for_later_ones():
    server, client = _pair(reader_timeout=0.05)
    try:
        peer, weights = _with_weights(server, client, torch.zeros(1 << 16))
        server.send(peer, [b"first", _bytes(weights)])
        server.wait_sent()  # not read within 0.05 s: given up on, and written
        weights.fill_(1.0)
        assert server.recv(0.01) is None
        assert client.recv(0.5) is None  # the late read is dropped (the weights changed)
        server._planes[0]._readers.timeout = 30.0  # from now on the shard would wait as long as it takes
        server.send(peer, [b"second", _bytes(weights)])
        wrote = threading.Event()

        def write():
            server.wait_sent()
            weights.fill_(2.0)
            wrote.set()
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        assert not wrote.wait(0.3), "the shard wrote its weights before the worker read the answer it was sent"
        _, got = _recv(client)  # read in place, whole
        assert torch.equal(torch.frombuffer(bytearray(got[1]), dtype=torch.float32), torch.ones(1 << 16))
        assert wrote.wait(5.0)  # and then the shard writes
        writer.join(5)
    finally:
        client.close()
        server.close()


@pytest.mark.timeout(30)
def test_an_offer_naming_another_live_processs_pid_is_declined():
    """The shard maps the memfds of the pid an offer names: an offer is taken only with that process's
    proof (a random token in a memfd of its own, which the shard reads through /proc/PID/fd/FD)."""
    other, its_offer = other_worker()
    sleeper = subprocess.Popen(["sleep", "30"])  # a live process that is no psrv worker at all
    me, plane = ShmClientPlane(), ShmServerPlane()
    try:
        mine = me.offer(0)
        assert plane.answer(b"me", mine, peer_address="127.0.0.1") is not None
        lies = {"our proof, its pid": {**mine, "pid": other.pid},
                "its pid and fd, a guessed token": {**its_offer, "token": os.urandom(32)},
                "its pid, no proof": {"boot": boot_id(), "pid": other.pid},
                "a pid that is no psrv worker": {**mine, "pid": sleeper.pid},
                "its proof, our pid": {**its_offer, "pid": os.getpid()}}
        taken = [why for why, offer in lies.items() if plane.answer(b"liar", offer, peer_address="127.0.0.1")]
        assert not taken, f"offers naming another process's pid accepted: {taken}"
        assert plane.answer(b"other", its_offer, peer_address="127.0.0.1") is not None  # with its own proof
    finally:
        plane.close()
        me.close()
        for p in (other, sleeper):
            p.kill()
            p.wait(5)
