"""GPU0 as the parameter server, and GPU workers against a CPU server: the same numbers as on CPU.

Marked `gpu`; every test skips cleanly where torch.cuda.is_available() is False.
"""
import json

import pytest
import torch

from psrv.config import OptimConfig
from psrv.server.optim import FUSED_MIN_ELEMENTS
from psrv.server.shard import Shard
from tests.helpers import psrv_run

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available())")]

CASES = [OptimConfig("sgd", lr=0.1, momentum=0.0), OptimConfig("sgd", lr=0.1, momentum=0.9, nesterov=True),
         OptimConfig("adam", lr=1e-3, momentum=0.0)]
TRAIN = ["--job", "digits_mlp", "--steps", "20", "--batch-size", "32", "--seed", "0"]


@pytest.mark.parametrize("size", [50_000, FUSED_MIN_ELEMENTS], ids=["unfused", "fused"])  # fused: the sync
@pytest.mark.parametrize("cfg", CASES, ids=lambda c: f"{c.name}-m{c.momentum}")  # mean divided in the step (grad_scale)
def test_a_shard_on_cuda_applies_the_same_step_as_on_cpu(cfg, size):
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(size, generator=gen)
    grads = [torch.randn(init.numel(), generator=gen) for _ in range(6)]
    cpu, gpu = Shard(init.numel(), cfg, device="cpu"), Shard(init.numel(), cfg, device="cuda:0")
    assert gpu.weights.is_cuda
    for shard in (cpu, gpu):
        shard.init(init)
        for g in grads[:3]:                    # async / SSP: one step per push
            shard.apply(g)
        for g in grads[3:]:                    # sync: the mean of a clock's gradients, one step
            shard.accumulate(g)
        assert shard.apply_accumulated() == 3
    assert cpu.version == gpu.version == 4
    torch.testing.assert_close(gpu.weights.cpu(), cpu.weights, rtol=1e-5, atol=1e-6)


def _worker(procs, name: str, address: str, device: str, tmp_path) -> torch.Tensor:
    params = tmp_path / f"{name}.pt"
    p = procs.start(name, "worker", "--servers", address, "--rank", "0", "--world-size", "1", *TRAIN,
                    "--device", device, "--params-out", str(params), "--out", str(tmp_path / f"{name}.json"))
    assert procs.wait(p, 150) == 0, procs.log(name)[-3000:]
    return torch.load(params)


@pytest.mark.timeout(180)
def test_a_cuda_worker_against_a_cpu_server_trains_like_a_cpu_worker(procs, tmp_path):
    server = ["--num-shards", "1", "--workers", "1", "--mode", "sync", "--optimizer", "sgd", "--lr", "0.1",
              "--momentum", "0", "--device", "cpu"]
    _, cpu_addr = procs.server("server-cpu-worker", *server)
    _, gpu_addr = procs.server("server-gpu-worker", *server)
    on_cpu = _worker(procs, "worker-cpu", cpu_addr, "cpu", tmp_path)
    on_gpu = _worker(procs, "worker-gpu", gpu_addr, "cuda:0", tmp_path)
    assert not on_gpu.is_cuda
    torch.testing.assert_close(on_gpu, on_cpu, rtol=0, atol=1e-4)
    record = json.loads((tmp_path / "worker-gpu.json").read_text())
    assert record["evals"][-1]["eval_accuracy"] > record["evals"][0]["eval_accuracy"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", ["zmq", "rpc"])
def test_gpu0_as_the_parameter_server_matches_the_cpu_server(transport, tmp_path):
    args = ["--mode", "sync", "--servers", "2", "--workers", "2", "--optimizer", "sgd", "--momentum", "0", *TRAIN]
    on_cpu = psrv_run(tmp_path / "cpu", "--transport", transport, "--device", "cpu", *args, timeout=80)
    on_gpu = psrv_run(tmp_path / "gpu", "--transport", transport, "--device", "cuda:0", *args, timeout=80)
    assert on_gpu["device"] == "cuda:0" and on_cpu["updates_applied"] == on_gpu["updates_applied"] == 20
    torch.testing.assert_close(torch.load(tmp_path / "gpu" / "params.pt"), torch.load(tmp_path / "cpu" / "params.pt"),
                               rtol=0, atol=1e-4)


@pytest.mark.parametrize("spec", ["int8", "fp4", "topk:0.1", "randomk:0.1", "float16"])
@pytest.mark.parametrize("ef", [True, False])
def test_cpu_parts_decode_into_a_cuda_copy_as_into_a_cpu_one(spec, ef):
    """A shard on cuda:0 decodes a push's CPU parts into its buffer, and a GPU worker applies a pull's CPU parts
    to its copy: the same numbers as on the CPU. Kills the `device=` mutants of the decoders and of
    PullDelta.apply_to that no CPU-only case can (make mutants; the meta device accepts CPU operands there)."""
    from psrv.codecs import make
    from psrv.codecs.pull import decode_pull, encode_pull, make_pull_codec
    g = torch.Generator().manual_seed(7)
    n = 2051
    w, x = torch.randn(n, generator=g), torch.randn(n, generator=g)
    fields, parts = encode_pull(make_pull_codec(spec, seed=0, sign_scale="l1"), x, w, ef=ef, dense=[[0, 7]], among=None)
    cpu, gpu = x.clone(), x.to("cuda:0")
    decode_pull(fields, parts, n).apply_to(cpu)
    decode_pull(fields, parts, n).apply_to(gpu)
    assert torch.equal(gpu.cpu(), cpu)
    if spec == "float16":
        return
    codec = make(spec, seed=0)
    pushed = codec.encode(torch.randn(n, generator=g), None)
    decoded = type(codec).decode(pushed, codec.params(), n)
    on_cpu, on_gpu = torch.ones(n), torch.ones(n, device="cuda:0")
    decoded.add_into(on_cpu, torch.empty(n))
    decoded.add_into(on_gpu, torch.empty(n, device="cuda:0"))
    assert torch.equal(on_gpu.cpu(), on_cpu)


@pytest.mark.parametrize("spec", ["topk:0.1", "int8"])
def test_a_push_with_dense_ranges_adds_into_a_cuda_sum_as_into_a_cpu_one(spec):
    """psrv/codecs/push.py WithDense.add_into: a push's dense ranges (tensors under --compress-min-numel), beside
    top-k's values or written over int8's, added to a shard's accumulator on cuda:0 from CPU parts. Kills the `.to(accum.device)` mutant that the meta
    device cannot (make mutants: it accepts CPU operands in add_)."""
    from psrv.codecs import make
    from psrv.codecs.push import PushEncoder, decode_push
    from psrv.partition import ParamSpec, PartitionPlan
    plan = PartitionPlan((ParamSpec("w", (2000,)), ParamSpec("b", (7,)), ParamSpec("v", (500,)), ParamSpec("c", (3,))),
                         1)
    fields, parts = PushEncoder(make(spec), plan, error_feedback=False, min_numel=10).encode(
        torch.randn(plan.total, generator=torch.Generator().manual_seed(8)), 0)
    on_cpu, on_gpu = torch.ones(plan.total), torch.ones(plan.total, device="cuda:0")
    decode_push(fields["codec"], parts, plan.total).add_into(on_cpu, torch.empty(plan.total))
    decode_push(fields["codec"], parts, plan.total).add_into(on_gpu, torch.empty(plan.total, device="cuda:0"))
    assert torch.equal(on_gpu.cpu(), on_cpu)


@pytest.mark.parametrize("spec", ["topk:0.1", "randomk:0.1"])  # the sparse codecs: values sent as they are
def test_a_push_encoder_given_cuda_gradients_sends_what_it_sends_given_cpu_ones(spec):
    """psrv/codecs/push.py PushEncoder.encode: the residual and the positions a sparse codec chooses among move to
    the gradient's device at its first push (a GPU worker's), and the pushes and residuals are those of the CPU.
    Kills the `.to(grad.device)` and device-test mutants of encode that no CPU-only case can (make mutants)."""
    from psrv.codecs import make
    from psrv.codecs.push import PushEncoder
    from psrv.partition import ParamSpec, PartitionPlan
    plan = PartitionPlan((ParamSpec("w", (2000,)), ParamSpec("b", (7,)), ParamSpec("v", (500,)), ParamSpec("c", (3,))),
                         2)
    on_cpu, on_gpu = (PushEncoder(make(spec, seed=1), plan, min_numel=10) for _ in range(2))
    gen = torch.Generator().manual_seed(9)
    for clock in range(3):
        g = torch.randn(plan.total, generator=gen)
        for shard in range(2):
            (fc, pc), (fg, pg) = on_cpu.encode(g, shard, clock), on_gpu.encode(g.to("cuda:0"), shard, clock)
            assert fc == fg and pc.keys() == pg.keys() and all(torch.equal(pc[k], pg[k]) for k in pc)
            on_cpu.settle(shard, applied=True)
            on_gpu.settle(shard, applied=True)
    assert on_gpu.error.device.type == "cuda" and torch.equal(on_gpu.error.cpu(), on_cpu.error)


def test_a_regional_shard_on_cuda_syncs_as_on_cpu():
    """A regional shard on GPU0 under a CPU global shard (psrv/server/hierarchy/upstream.py): the same global
    weights as with every shard on the CPU (the link's tensors cross host memory both ways)."""
    from psrv.client.psclient import PSClient
    from psrv.config import ServerConfig
    from psrv.partition import ParamSpec, PartitionPlan
    from psrv.server.run import Server
    size, plan = 1000, PartitionPlan((ParamSpec("w", (1000,), "float32"),), 1)
    grads = [torch.randn(size, generator=torch.Generator().manual_seed(k)) for k in range(6)]

    def run(device: str) -> torch.Tensor:
        top = Server(ServerConfig(mode="async", workers=1, optimizer=OptimConfig("sgd", lr=1.0, momentum=0.0)))
        top.start()
        below = Server(ServerConfig(mode="async", workers=1, upstream=top.address, upstream_every=2, device=device,
                                    optimizer=OptimConfig("sgd", lr=0.1, momentum=0.9)))
        below.start()
        c = PSClient([below.address], plan, worker=0, world_size=1)
        try:
            c.hello()
            c.init(torch.zeros(size))
            w = torch.zeros(size)
            for k, g in enumerate(grads):
                c.push_pull(g, clock=k, out=w)
            c.leave()
            below.join()
            top.join()
            return top._service.shard.weights.clone()
        finally:
            c.close()
            below.close()
            top.close()
    torch.testing.assert_close(run("cuda:0"), run("cpu"), rtol=1e-5, atol=1e-6)
