"""The bulk plane (psrv/transport/bulk.py): tensors on a plain TCP connection beside zmq.

A real shard (ShardService over ZmqServer, in a thread) and a real PSClient on 127.0.0.1: the shard
picks the bulk plane, every push and pull payload goes over it (the planes count the bytes), the
weights are what SGD gives, and a broken bulk connection is answered RESET, the push retried inline
and applied once, and the plane set up again.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import msgpack
import pytest
import torch
import zmq

from psrv.client.psclient import PSClient
from psrv.config import OptimConfig, ServerConfig
from psrv.partition import ParamSpec, PartitionPlan
from psrv.server.service import ShardService
from psrv.transport.bulk import BulkClientPlane, BulkServerPlane, tcp_host
from psrv.transport.bulk_link import READY, Link
from psrv.transport.plane import MIN_BYTES, OFFER, PAYLOAD, RESET
from psrv.transport.zmq import ZmqClient, ZmqServer

SIZE = 4 * MIN_BYTES // 4  # floats: four times the smallest payload a plane carries
LR = 0.5


@pytest.fixture
def shard():
    cfg = ServerConfig(workers=1, mode="async", optimizer=OptimConfig(name="sgd", lr=LR, momentum=0.0))
    plane = BulkServerPlane("tcp://127.0.0.1:0", timeout=2.0)
    transport = ZmqServer("tcp://127.0.0.1:0", planes=[plane])
    service = ShardService(cfg, transport)
    thread = threading.Thread(target=service.serve, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield transport, plane, service
    service.state.stopped = True
    thread.join(10)
    transport.close()
    assert not thread.is_alive()


def client_for(transport: ZmqServer) -> tuple[PSClient, BulkClientPlane, ZmqClient]:
    plane = BulkClientPlane([transport.address], timeout=2.0)
    net = ZmqClient([transport.address], planes=[plane])
    plan = PartitionPlan((ParamSpec("w", (SIZE,)),), 1)
    return PSClient([transport.address], plan, worker=0, world_size=1, timeout=20, retry_interval=0.3,
                    heartbeat=False, net=net), plane, net


def sgd_steps(client: PSClient, weights: torch.Tensor, grads: list[torch.Tensor], first_clock: int) -> None:
    for i, grad in enumerate(grads):
        client.push_pull(grad, clock=first_clock + i, out=weights)


@pytest.mark.timeout(60)
def test_pushes_and_pulls_go_over_the_bulk_plane_and_survive_a_broken_connection(shard):
    transport, server_plane, service = shard
    client, client_plane, net = client_for(transport)
    assert server_plane._listener.getsockname()[0] == "127.0.0.1"  # never wider than the zmq bind
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(SIZE, generator=gen)
    grads = [torch.randn(SIZE, generator=gen) for _ in range(6)]
    with client:
        client.hello()
        client.init(init)
        weights = torch.zeros(SIZE)
        client.pull(clock=0, out=weights)
        sgd_steps(client, weights, grads[:3], 0)
        assert net._plane[0] is client_plane  # the shard chose the bulk plane
        payload = SIZE * 4
        assert server_plane.bytes_in >= 3 * payload, server_plane.bytes_in  # the pushes came over it
        assert client_plane.bytes_in >= 3 * payload, client_plane.bytes_in  # and the weights went back

        # The shard loses the connection (as after a broken link): the next push is answered RESET,
        # retried inline, applied once; the worker then offers again and the plane comes back.
        server_plane.forget(next(iter(server_plane._links)))
        sgd_steps(client, weights, grads[3:], 3)
        assert net._plane[0] is client_plane and server_plane._links, "the bulk plane was set up again"
        version = service.shard.version
        client.leave()

    want = init.clone()
    for grad in grads:
        want -= LR * grad
    assert version == 6  # each push applied exactly once, the retried one too
    torch.testing.assert_close(weights, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(service.shard.weights, want, rtol=0, atol=1e-5)


def test_the_bulk_socket_listens_where_zmq_binds():
    assert tcp_host("tcp://127.0.0.1:0") == "127.0.0.1"
    assert tcp_host("tcp://*:5555") == "" and tcp_host("tcp://0.0.0.0:5555") == ""
    assert tcp_host("tcp://[::1]:5555") == "::1"
    assert tcp_host("ipc:///tmp/x.sock") is None
    plane = BulkServerPlane("ipc:///tmp/psrv-none.sock")  # nothing remote to serve: it declines
    assert plane.answer(b"peer", {}, peer_address="") is None
    plane.close()


@pytest.mark.timeout(30)
def test_a_second_worker_does_not_wait_for_the_first_ones_connection():
    """An offer sweeps the links of workers that went away: a live link is checked without waiting."""
    plane = BulkServerPlane("tcp://127.0.0.1:0", timeout=5.0)
    try:
        first = plane.answer(b"w0", {}, peer_address="")
        conn = socket.create_connection(("127.0.0.1", first["port"]), timeout=5)
        conn.sendall(first["token"])
        assert conn.recv(1) == READY
        started = time.monotonic()
        assert plane.answer(b"w1", {}, peer_address="") is not None
        assert time.monotonic() - started < 1.0
        assert b"w0" in plane._links  # alive, kept
        conn.close()
        deadline = time.monotonic() + 5
        while b"w0" in plane._links and time.monotonic() < deadline:  # gone: swept at the next offer
            plane.answer(b"w2", {}, peer_address="")
            time.sleep(0.01)
        assert b"w0" not in plane._links
    finally:
        plane.close()


@pytest.mark.timeout(30)
def test_a_slow_readers_payload_is_copied_when_the_shard_writes_its_weights():
    """writing() detaches what is left of a payload a worker has not read yet: it reads the weights as
    sent, whole, while the shard overwrites them (it never waits for the reader, nor tears its read)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname(), timeout=5)
        b, _ = listener.accept()
    sender, receiver = Link(a, 5.0), Link(b, 5.0)
    weights = torch.arange(16 * 2**20, dtype=torch.int32)  # 64 MB: more than the sockets' buffers hold
    want = weights.clone()
    descriptor = sender.send(memoryview(weights.numpy()))
    time.sleep(0.3)  # the kernel's buffers fill; the rest waits for the reader
    sender.detach()
    weights.zero_()  # the shard's next update
    got = torch.empty_like(want)
    assert receiver.read(descriptor, memoryview(got.numpy())) == 64 * 2**20
    assert torch.equal(got, want)
    sender.close()
    receiver.close()


@pytest.mark.timeout(30)
def test_a_worker_that_cannot_connect_goes_on_through_zmq(shard):
    """A bulk port the worker cannot reach (a firewall): the client's plane declines its next offers,
    and pushes and pulls go inline, right."""
    transport, server_plane, service = shard
    client, client_plane, net = client_for(transport)
    server_plane.port = 1  # what the shard's answer names: nothing listens there
    with client:
        client.hello()
        init = torch.ones(SIZE)
        client.init(init)  # (its payload may be the one lost to the failed plane: the retry goes inline)
        weights = torch.zeros(SIZE)
        client.pull(clock=0, out=weights)
        client.push_pull(torch.full((SIZE,), 2.0), clock=0, out=weights)
        assert net._plane[0] is None and client_plane.offer(0) == {"declined": True}
        assert server_plane.bytes_in == 0 and transport.payload_bytes["inline"] > 0
        client.leave()
    torch.testing.assert_close(weights, torch.full((SIZE,), 1.0 - LR * 2.0))


@pytest.mark.timeout(60)
def test_exactly_once_over_the_bulk_plane_through_a_lossy_network(shard):
    """Requests dropped and duplicated, replies dropped (tests/integration/test_faults.py's
    FaultyTransport around the bulk-plane client): every push is applied exactly once, and the
    weights are sequential SGD's."""
    from tests.integration.test_faults import FaultyTransport
    transport, server_plane, service = shard
    plane = BulkClientPlane([transport.address], timeout=2.0)
    net = FaultyTransport(ZmqClient([transport.address], planes=[plane]), seed=18, drop=0.2, dup=0.2, drop_reply=0.2)
    plan = PartitionPlan((ParamSpec("w", (SIZE,)),), 1)
    gen = torch.Generator().manual_seed(1)
    init, grads = torch.randn(SIZE, generator=gen), [torch.randn(SIZE, generator=gen) for _ in range(12)]
    with PSClient([transport.address], plan, worker=0, world_size=1, timeout=30, retry_interval=0.05,
                  heartbeat=False, net=net) as client:
        client.hello()
        client.init(init)
        weights = torch.empty(SIZE)
        client.pull(clock=0, out=weights)
        sgd_steps(client, weights, grads, 0)
        client.pull(clock=len(grads), out=weights, final=True)
        client.leave()
    assert min(net.injected.values()) > 0, net.injected
    assert service.shard.version == len(grads) and plane.bytes_out >= len(grads) * SIZE * 4
    want = init.clone()
    for grad in grads:
        want.add_(grad, alpha=-LR)
    torch.testing.assert_close(weights, want, rtol=0, atol=1e-5)


@pytest.mark.timeout(30)
def test_a_peer_that_trickles_a_payload_is_dropped_at_its_deadline_and_the_message_answered_reset():
    """One byte every 0.1 s keeps every socket call within its 0.5 s timeout, so only a deadline for the
    whole payload frees the shard's one thread: the link is dropped and the message answered RESET (the
    worker then re-sends inline)."""
    server = ZmqServer("tcp://127.0.0.1:0", planes=[BulkServerPlane("tcp://127.0.0.1:0", timeout=0.5)])
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(server.address)
    stop, conn = threading.Event(), None

    def trickle():
        while not stop.wait(0.1):
            try:
                conn.send(b"\0")
            except OSError:
                return
        conn.close()  # (after 5 s at most: a shard still reading then ends, with the link closed)
    try:
        dealer.send_multipart([OFFER, msgpack.packb({"bulk": {}})])
        assert server.recv(2.0) is None and dealer.poll(2000)
        answer = msgpack.unpackb(dealer.recv_multipart()[1])["bulk"]
        conn = socket.create_connection(("127.0.0.1", answer["port"]), timeout=5)
        conn.sendall(answer["token"])
        assert conn.recv(1) == READY
        threading.Thread(target=trickle, daemon=True).start()
        threading.Timer(5.0, stop.set).start()
        dealer.send_multipart([PAYLOAD, b"header", struct.pack("!QQ", 0, MIN_BYTES)])
        started = time.monotonic()
        assert server.recv(10.0) is None  # the payload never came whole
        held = time.monotonic() - started
        assert held < 3.0, f"the shard's thread was held {held:.1f} s by a peer sending a byte every 0.1 s"
        assert dealer.poll(2000) and dealer.recv_multipart() == [RESET]
    finally:
        stop.set()
        dealer.close()
        server.close()
