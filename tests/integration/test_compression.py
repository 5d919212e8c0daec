"""Compressed pushes against real shards (zmq, served from threads): the bytes measured on the wire
(topk:0.01 about 2% of the float32 push, sign about 1/32 plus scales), every byte the client counts
arriving at the shards, and the error-feedback residuals saved and restored through state_dict."""
from __future__ import annotations

import pytest
import torch

import psrv
from psrv.client.psclient import PSClient
from psrv.codecs import make
from psrv.config import ServerConfig
from psrv.partition import PartitionPlan
from psrv.protocol import ErrorCode, Message, MsgType, decode, encode
from psrv.server.run import Server
from psrv.transport import create_client

pytestmark = pytest.mark.timeout(120)
SHARDS = 2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))


class Shards:
    """SHARDS async shards on ephemeral ports, each served from its own thread."""

    def __init__(self, *, num_shards: int = SHARDS, nonfinite: str = "reject"):
        self.num_shards, self.nonfinite = num_shards, nonfinite

    def __enter__(self):
        self.servers = [Server(ServerConfig(shard=s, num_shards=self.num_shards, workers=1, mode="async",
                                            nonfinite=self.nonfinite, bind="tcp://127.0.0.1:0", worker_timeout=30.0))
                        for s in range(self.num_shards)]
        for s in self.servers:
            s.start()
        return [s.address for s in self.servers]

    def __exit__(self, *exc):
        self.summaries = []
        for s in self.servers:
            s.stop()
            self.summaries.append(s.join(10))


def _train(addresses, steps: int, **kw) -> psrv.Worker:
    model = _model()
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    ps = psrv.Worker(model, addresses, rank=0, world_size=1, timeout=20, **kw)
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x), y).backward()
        ps.step()
    return ps


@pytest.mark.parametrize("spec,low,high", [("topk:0.01", 0.02, 0.0215), ("sign", 1 / 32 + 1 / 1024, 0.0345),
                                            ("", 1.0, 1.0015)], ids=["topk", "sign", "dense"])
def test_the_bytes_measured_on_the_wire(spec, low, high):
    """Every tensor compressed (compress_min_numel 0): topk:0.01 sends 1% of the elements as 4-byte
    values and 4-byte indices, 2% of the float32 bytes; sign 1 bit per element (1/32) and a float32
    scale per 1024 elements (1/1024); the headers add about 0.1% (two of about 110 bytes a step). Without
    the warm-up (compress_warmup 0): top-k sends its ratio from the first push."""
    shards = Shards()
    with shards as addresses:
        ps = _train(addresses, steps=3, compress=spec, compress_min_numel=0, compress_warmup=0)
        ps.close()
        wire = ps.wire_bytes()
    assert wire["dense_push_bytes"] == 3 * 4 * sum(p.numel() for p in _model().parameters())
    assert low <= wire["bytes_pushed"] / wire["dense_push_bytes"] <= high, wire
    # every byte the client counted reached the shards, which also saw the heartbeat thread's beats
    # (its own sockets, not counted: tens of bytes each)
    assert 0 <= sum(s["bytes_in"] for s in shards.summaries) - wire["bytes_sent"] < 1000
    assert 0 <= sum(s["bytes_out"] for s in shards.summaries) - wire["bytes_received"] < 1000


def test_the_warm_up_sends_the_larger_ratios_of_its_stages_first():
    """compress_warmup 4 (DGC's warm-up, a stage a push): pushes 0, 1, 2 of topk:0.01 send 0.01^(1/5),
    0.01^(2/5), 0.01^(3/5) of the elements, 8 bytes each against float32's 4, plus the headers."""
    with Shards() as addresses:
        ps = _train(addresses, steps=3, compress="topk:0.01", compress_min_numel=0, compress_warmup=4)
        ps.close()
        wire = ps.wire_bytes()
    want = 2 * sum(0.01 ** (s / 5) for s in (1, 2, 3)) / 3
    assert want <= wire["bytes_pushed"] / wire["dense_push_bytes"] <= want + 0.0015, (want, wire)


def test_error_buffers_are_saved_and_restored_through_state_dict(tmp_path):
    with Shards() as addresses:
        ps = _train(addresses, steps=2, compress="topk:0.01")
        state = ps.state_dict()
        torch.save(state, tmp_path / "worker.pt")
        ps.close()
    error, velocity = state["compress"]["error"], state["velocity"]["velocity"]  # the shards' SGD has momentum 0.9
    assert error.abs().sum() > 0  # top-k left most of two gradients behind
    assert velocity.abs().sum() > 0  # momentum correction's velocity
    with Shards() as addresses:  # a restarted worker, on restarted shards
        again = psrv.Worker(_model(), addresses, rank=0, world_size=1, timeout=20, compress="topk:0.01")
        again.load_state_dict(torch.load(tmp_path / "worker.pt"))
        assert torch.equal(again._client.encoder.error, error) and again.steps == 2
        assert torch.equal(again._client.velocity.velocity, velocity)
        with pytest.raises(ValueError, match="error feedback"):
            again.load_state_dict({**state, "compress": {"error": None}})
        with pytest.raises(ValueError, match="velocity"):
            again.load_state_dict({**state, "velocity": None})
        again.close()



def test_local_steps_push_a_compressed_pseudo_gradient():
    """Local steps compose: every second step pushes the top-k of w_pulled - w_now, its residual kept."""
    with Shards() as addresses:
        model = _model()
        ps = psrv.Worker(model, addresses, rank=0, world_size=1, timeout=20, local_steps=2,
                         compress="topk:0.1", compress_min_numel=0, compress_warmup=0)
        x, y = torch.randn(64, 256), torch.randn(64, 1)
        for _ in range(4):
            torch.nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():  # the inner SGD step, by hand (torch.optim's first import costs seconds)
                for p in model.parameters():
                    p -= 0.01 * p.grad
            ps.step()
        wire, error = ps.wire_bytes(), ps.state_dict()["compress"]["error"]
        ps.close()
    assert wire["dense_push_bytes"] == 2 * 4 * error.numel()  # two pushes, not four
    assert 4.9 < wire["compression_ratio"] < 5  # 10% as values + indices, less the headers
    assert error.abs().sum() > 0 and len(ps.pseudo_grad_norms) == 2


@pytest.mark.parametrize("policy", ["reject", "skip"])
def test_an_int8_push_with_one_nan_reaches_the_shard_as_non_finite(policy):
    """The codec's own parts (no worker-side check in the way) of a gradient with one NaN, sent to a real
    shard: refused (NONFINITE) under --nonfinite reject, acknowledged as dropped under skip; either way
    the weights stay as they were, and the same push without the NaN is then applied."""
    plan = PartitionPlan.from_module(_model(), 1)
    grad = torch.randn(plan.total, generator=torch.Generator().manual_seed(3))
    grad[777] = float("nan")
    codec = make("int8")
    shards = Shards(num_shards=1, nonfinite=policy)
    with shards as addresses:
        client = PSClient(addresses, plan, worker=0, world_size=1, timeout=20, heartbeat=False)
        raw = create_client("zmq", addresses)
        try:
            client.hello()
            client.init(torch.zeros(plan.total))

            def push(seq: int, g: torch.Tensor) -> Message:
                fields = {"codec": {"name": codec.name, **codec.params(), "n": plan.total}}
                raw.send(0, encode(Message(MsgType.PUSH, worker=0, session=client.session, seq=seq, fields=fields,
                                           parts=codec.encode(g, None))))
                got = raw.recv(timeout=10)
                assert got is not None, "no reply"
                return decode(got[1])

            def weights() -> torch.Tensor:
                out = torch.empty(plan.total)
                client.pull(clock=0, out=out)
                return out

            reply = push(10**6, grad)
            if policy == "reject":
                assert reply.type is MsgType.ERROR and reply.fields["code"] == ErrorCode.NONFINITE, reply.fields
            else:
                assert reply.type is MsgType.OK and reply.fields.get("dropped") == "nonfinite", reply.fields
            assert not weights().any(), "the NaN push touched the weights"
            grad[777] = 0.0
            assert push(10**6 + 1, grad).type is MsgType.OK
            assert weights().any()  # a finite push is applied: the check above could fail
        finally:
            raw.close()
            client.close()
