"""pull_in_place (psrv/client/in_place.py, psrv/transport/shm.py `_hold`): a co-located worker computes on its shard's
weights where they lie, mapped read-only, held until its next request; the shard writes them only after that; a
push computed on weights that changed while held is not sent; where a shard cannot promise that, pulls copy."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import psrv
from psrv.cli import build_parser
from psrv.client.in_place import InPlacePulls
from psrv.client.psclient import PSClient
from psrv.config import ServerConfig
from psrv.config.cli_args import config_from_args
from psrv.partition import ParamSpec, PartitionPlan
from tests.helpers import ROOT, Procs
from tests.integration.test_shm_plane import _pair, _recv, _with_weights, _writer

N = 1 << 16  # floats: 256 KB, over the plane's MIN_BYTES


def test_an_answer_read_in_place_is_the_shards_memory_held_until_released():
    server, client = _pair(reader_timeout=30.0)
    try:
        peer, weights = _with_weights(server, client, torch.arange(N, dtype=torch.float32))
        client.read_in_place(0, True)
        server.send(peer, [b"weights", memoryview(weights.numpy()).cast("B")])
        _, got = _recv(client)
        view = got[1]
        assert view.readonly and view.nbytes == N * 4
        address = client.held(0)
        assert address is not None and address == np.frombuffer(view, dtype=np.uint8).ctypes.data
        assert torch.equal(torch.frombuffer(bytearray(view), dtype=torch.float32), torch.arange(N, dtype=torch.float32))
        writer, wrote = _writer(server, weights)
        assert not wrote.wait(0.5)  # held: the shard waits for this worker
        assert client.release(0) is True  # unchanged while held
        assert client.held(0) is None
        assert wrote.wait(5.0)
        writer.join()
        assert torch.frombuffer(bytearray(view), dtype=torch.float32).eq(-1.0).all()  # the shard's own memory
    finally:
        client.close()
        server.close()


def test_weights_written_while_held_are_reported_changed_at_release():
    server, client = _pair(reader_timeout=0.05)
    try:
        peer, weights = _with_weights(server, client, torch.zeros(N))
        client.read_in_place(0, True)
        server.send(peer, [b"weights", memoryview(weights.numpy()).cast("B")])
        _recv(client)
        server.wait_sent()  # the worker holds them past the reader timeout: the shard writes anyway
        assert server._planes[0]._readers.given_up == 1
        weights.fill_(1.0)
        assert server.recv(0.01) is None  # the service's next call: the write is over
        assert client.release(0) is False
        assert client.release(0) is True  # nothing held any more
    finally:
        client.close()
        server.close()


def test_without_the_hint_an_answer_by_place_is_copied_as_before():
    server, client = _pair()
    try:
        peer, weights = _with_weights(server, client, torch.arange(N, dtype=torch.float32))
        server.send(peer, [b"weights", memoryview(weights.numpy()).cast("B")])
        _, got = _recv(client)
        assert not got[1].readonly and client.held(0) is None
    finally:
        client.close()
        server.close()


WRITER = textwrap.dedent("""
    import torch
    from tests.integration.test_shm_plane import _pair, _recv, _with_weights
    server, client = _pair()
    peer, weights = _with_weights(server, client, torch.zeros({n}))
    client.read_in_place(0, True)
    server.send(peer, [b"weights", memoryview(weights.numpy()).cast("B")])
    _, got = _recv(client)
    from psrv.protocol.codec import _writable
    w = torch.frombuffer(_writable(got[1]), dtype=torch.float32)
    print("read", float(w.sum()), flush=True)
    w.fill_(5.0)  # a write to the shard's weights from the worker: the mapping is read-only
    print("wrote", flush=True)
""").format(n=N)


def test_a_worker_writing_the_weights_it_reads_in_place_faults_instead_of_changing_the_shards():
    p = subprocess.run([sys.executable, "-c", WRITER], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "read 0.0" in p.stdout, p.stderr
    assert "wrote" not in p.stdout and p.returncode == -11, (p.returncode, p.stdout, p.stderr[-2000:])


def _serve(*args: str) -> psrv.Server:
    return psrv.Server(config_from_args(ServerConfig, build_parser().parse_args(
        ["serve", "--bind", "tcp://127.0.0.1:0", "--optimizer", "sgd", "--lr", "0.5", "--momentum", "0",
         *args]))).start()


@pytest.mark.parametrize("mode,workers,in_place", [("async", 1, True), ("sync", 1, True), ("async", 2, False)])
def test_a_client_reads_in_place_only_where_the_shard_says_it_never_writes_while_a_worker_computes(
        mode, workers, in_place, caplog):
    server = _serve("--mode", mode, "--workers", str(workers))
    plan = PartitionPlan((ParamSpec("w", (N,)),), 1)
    try:
        with PSClient([server.address], plan, worker=0, world_size=workers, timeout=30, shared_memory=True,
                      pull_in_place=True) as c:
            c.hello()
            out = torch.zeros(plan.total)
            grad = c.share(torch.ones(plan.total))
            c.init(out)
            c.pull(clock=0, out=out)
            versions = []
            for step in range(3 if workers == 1 else 1):
                reply = c.push_pull(grad, clock=step, out=out)
                versions.append(reply.versions[0])
                assert reply.weights.eq(-0.5 * reply.versions[0]).all()
            assert (reply.weights.data_ptr() != out.data_ptr()) is in_place
            assert c.in_place.on is in_place
            assert (c.in_place.read, c.in_place.copied) == ((4, 0) if in_place else (0, 0))
            c.leave()
    finally:
        server.stop()
    assert in_place or "pull_in_place is off" in caplog.text


class _Net:
    def __init__(self, intact):
        self.intact = intact

    def release(self, shard):
        return self.intact


def test_a_push_on_weights_that_changed_while_held_is_refused_and_other_requests_go():
    torn = InPlacePulls(_Net(False), wanted=True, worker=3)
    torn.on = True
    torn.release(0, pushing=False)  # a pull or a LEAVE: nothing was computed on them
    with pytest.raises(RuntimeError, match="worker 3: shard 0 wrote its weights while this worker computed"):
        torn.release(0, pushing=True)
    InPlacePulls(_Net(True), wanted=True, worker=3).release(0, pushing=True)


def _train(in_place: bool) -> tuple[list[torch.Tensor], dict]:
    """Three sync steps of psrv.Worker on a 256 x 256 linear layer against a shard of one worker."""
    server = _serve("--mode", "sync", "--workers", "1")
    torch.manual_seed(0)
    model, x = torch.nn.Linear(256, 256), torch.randn(8, 256)
    try:
        w = psrv.Worker(model, [server.address], rank=0, world_size=1, pull_in_place=in_place)
        own = w._flat.own.data_ptr()
        for _ in range(3):
            model(x).square().mean().backward()
            w.step()
            assert (model.weight.data_ptr() != own) is in_place  # the shard's weights, not a copy of them
        w.close()
        assert w._flat.params.data_ptr() == own and model.weight.data_ptr() == own  # its own again
        planes = server.service.state.transport._planes
        assert [p._readers.given_up for p in planes if hasattr(p, "_readers")] == [0]  # never waited out
        return [p.detach().clone() for p in model.parameters()], w.totals()
    finally:
        server.stop()


def test_psrv_worker_computes_on_the_shards_weights_and_keeps_its_own_after_close():
    (held, totals), (copied, plain) = _train(True), _train(False)
    assert (totals["pulls_in_place"], totals["pulls_copied"]) == (5, 0)  # the first pull, three steps, the final
    assert "pulls_in_place" not in plain
    assert all(torch.equal(a, b) for a, b in zip(held, copied))
    torch.manual_seed(0)
    assert not torch.equal(held[0], torch.nn.Linear(256, 256).weight)  # it trained
