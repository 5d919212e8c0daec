"""GPU0 as the parameter server, and GPU workers against a CPU server: the same numbers as on CPU.

Marked `gpu`; every test skips cleanly where torch.cuda.is_available() is False.
"""
import dataclasses
import io
import json

import pytest
import torch

from psrv.config import OptimConfig
from psrv.server.optim import FUSED_MIN_ELEMENTS, flat_optimizer
from psrv.server.shard import Shard
from tests.conformance.axes import ATOL, DEFAULT, RTOL, case_id, run_config
from tests.conformance.cluster import Hooks, one_thread, run  # noqa: F401 (one_thread: an autouse fixture)
from tests.conformance.ref_streaming import reference_of
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


@pytest.mark.parametrize("spec", ["int8", "fp4", "sign", "topk:0.1", "randomk:0.1", "float16"])
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
    on_cpu, on_gpu = _encoded_on_both(spec, (2000, 7, 500, 3), seed=9,
                                      same=lambda a, b: all(torch.equal(a[k], b[k]) for k in a))
    assert on_gpu.error.device.type == "cuda" and torch.equal(on_gpu.error.cpu(), on_cpu.error)


def _encoded_on_both(spec: str, sizes: tuple, *, seed: int, same) -> tuple:
    """Two PushEncoders of `spec` over a plan of tensors of `sizes` on 2 shards, one given CPU gradients, one the same
    on cuda:0, three clocks of pushes each settled; every push's fields equal, and its parts (on the CPU) `same`."""
    from psrv.codecs import make
    from psrv.codecs.push import PushEncoder
    from psrv.partition import ParamSpec, PartitionPlan
    plan = PartitionPlan(tuple(ParamSpec(f"t{i}", (n,)) for i, n in enumerate(sizes)), 2)
    on_cpu, on_gpu = (PushEncoder(make(spec, seed=1), plan, min_numel=10) for _ in range(2))
    gen = torch.Generator().manual_seed(seed)
    for clock in range(3):
        g = torch.randn(plan.total, generator=gen)
        for shard in range(2):
            (fc, pc), (fg, pg) = on_cpu.encode(g, shard, clock), on_gpu.encode(g.to("cuda:0"), shard, clock)
            assert fc == fg and pc.keys() == pg.keys() and all(v.device.type == "cpu" for v in pg.values())
            assert same(pc, pg), (spec, clock, shard)
            on_cpu.settle(shard, applied=True)
            on_gpu.settle(shard, applied=True)
    return on_cpu, on_gpu


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


@pytest.mark.parametrize("spec", ["int8", "sign", "sparseloco:0.05"])  # the quantising codecs
def test_a_push_encoder_given_cuda_gradients_quantises_as_given_cpu_ones(spec):
    """PushEncoder.encode on a GPU worker's gradients with int8's and sign's chunk scales (psrv/codecs/scale_blocks.py
    `covered`) and SparseLoCo's chunked top-k (sparseloco.py `chosen_in_pool`) made on the GPU: the positions and
    codes of the CPU, the scales to float32's last bits (a sum on the GPU runs in another order)."""
    on_cpu, on_gpu = _encoded_on_both(spec, (5000, 7, 1500), seed=10, same=lambda a, b: all(
        (torch.allclose if a[k].is_floating_point() else torch.equal)(a[k], b[k]) for k in a))
    assert on_gpu.error.device.type == "cuda"
    torch.testing.assert_close(on_gpu.error.cpu(), on_cpu.error, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
def test_a_cuda_adam_keeps_its_state_where_torch_does_through_a_checkpoint(fused):
    """psrv/server/optim.py on cuda:0: the moments on the GPU, the step count there for the fused kernel and on the
    CPU for the other (torch.optim.Adam's layout); a checkpoint read into host memory is put back the same way, and
    the steps after it are those of the optimizer never saved, each gradient divided by 2 (the fused kernel's
    grad_scale, on the GPU)."""
    gen = torch.Generator().manual_seed(3)
    init = torch.randn(4099, generator=gen)
    grads = [torch.randn(init.numel(), generator=gen) for _ in range(4)]
    cfg = OptimConfig("adam", lr=1e-2, momentum=0.0)
    first = flat_optimizer(cfg, init.to("cuda:0"), fused=fused)
    for g in grads[:2]:  # a copy each: step leaves the quotient in it
        first.step(g.to("cuda:0", copy=True), divisor=2.0)
    where = {"step": "cuda:0" if fused else "cpu", "exp_avg": "cuda:0", "exp_avg_sq": "cuda:0"}
    assert {k: str(v.device) for k, v in first.state.items()} == where
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    resumed = flat_optimizer(cfg, first.param.clone(), fused=fused)
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), map_location="cpu"))
    assert {k: str(v.device) for k, v in resumed.state.items()} == where
    for g in grads[2:]:
        first.step(g.to("cuda:0", copy=True), divisor=2.0)
        resumed.step(g.to("cuda:0", copy=True), divisor=2.0)
    assert torch.equal(resumed.param, first.param) and float(resumed.state["step"]) == 4


class _OnGpu(Hooks):
    """Every shard of a conformance case, primaries and backups, on cuda:0 (the workers stay on the CPU); the device
    each one's weights are on once the workers have ended."""

    def __init__(self):
        self.replicas, self.devices = [], []

    def server_config(self, config):
        return dataclasses.replace(config, device="cuda:0")

    def started(self, servers, backups, witness):
        self.replicas = servers + backups

    def finished(self):
        self.devices = [str(r.service.shard.weights.device) for r in self.replicas]


GPU_CASES = [  # each a matrix case (tests/conformance/axes.py) whose shard paths hold a device
    {**DEFAULT, "local": 2, "fragments": 2, "outer": "int8", "pull": "topk", "replicas": 1},  # fragments, their pulls
    {**DEFAULT, "local": 2, "codec": "sparseloco", "ef_decay": 0.5},  # SparseLoCo's 2-bit push decoded on the GPU
    {**DEFAULT, "mode": "async", "codec": "sign", "pull": "sign", "optimizer": "adam", "replicas": 1},
    {**DEFAULT, "mode": "ssp", "codec": "topk", "pull": "topk", "shards": 3, "optimizer": "nesterov"}]


@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_conformance_cases_on_gpu0_shards_meet_their_reference(case):
    """Matrix cases with every shard on cuda:0, held to the reference as tests/conformance/test_matrix.py holds them
    on the CPU (the counts exact, the weights to its tolerance; not bit for bit against the CPU's run): the pull
    copies, fragments and codecs a GPU shard keeps on the GPU, and a backup's state sent from one."""
    cfg, hooks = run_config(case), _OnGpu()
    got = run(cfg, nan=False, hooks=hooks)
    want = reference_of(cfg, nan=False).run()
    assert not got.errors and hooks.devices == ["cuda:0"] * case["shards"] * (1 + case["replicas"]), hooks.devices
    for shard in got.shards:
        mine = {k: shard[k] for k in ("pushes", "pushes_applied", "updates_applied")} | {"dropped": shard["dropped"]}
        assert mine == want.counts
    for b in got.backups:
        assert b.summary["version"] == got.shards[b.shard]["version"] and not b.summary["failovers"]
    gap = (got.params - want.params).abs().max().item()
    assert torch.allclose(got.params, want.params, atol=ATOL, rtol=RTOL), f"{gap:.3g} from the reference"


def test_a_cuda_shards_fragment_optimizers_live_on_the_gpu_and_come_back_there_from_a_state():
    """psrv/server/fragments.py beside a shard on cuda:0: each fragment's outer optimizer (a Shard of its own) is made
    on the shard's device, and a state read into host memory (a checkpoint, a joining backup's) is put back there;
    the steps after it are those of the fragments never saved. On the CPU a fragment's Shard would work as well,
    through host copies: only its device tells."""
    from psrv.server.fragments import FragmentShards
    cfg = OptimConfig("sgd", lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(4)
    keys = (((0, 300), (700, 1000)), ((300, 700),))
    shard = Shard(1000, cfg, device="cuda:0")
    shard.init(torch.randn(1000, generator=gen))
    fragments = FragmentShards()

    def clock(fs: FragmentShards, on: Shard, key, grads) -> None:
        for g in grads:
            fs.accumulate(on, key, g.to("cuda:0", copy=True), merge=False, weight=1)
        fs.apply_accumulated(on)

    for key in keys:
        clock(fragments, shard, key, [torch.randn(600 if key == keys[0] else 400, generator=gen) for _ in range(2)])
    assert [str(sub.weights.device) for sub in fragments._shards.values()] == ["cuda:0"] * 2
    buf = io.BytesIO()
    torch.save(fragments.state_dict(), buf)
    again = Shard(1000, cfg, device="cuda:0")
    again.init(shard.weights.cpu())
    resumed = FragmentShards()
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), map_location="cpu"), again)
    assert [str(sub.weights.device) for sub in resumed._shards.values()] == ["cuda:0"] * 2
    for key in keys:
        grads = [torch.randn(600 if key == keys[0] else 400, generator=gen) for _ in range(2)]
        clock(fragments, shard, key, grads)
        clock(resumed, again, key, grads)
    assert torch.equal(again.weights, shard.weights)


@pytest.mark.parametrize("codec", ["topk:0.05", "int8"])
def test_a_cuda_backup_given_the_copies_state_answers_compressed_pulls_as_its_cpu_primary(codec):
    """psrv/server/pulls/copies.py on a GPU0 backup: the pull copies' state from a CPU primary (host tensors, as a
    join sends them) loaded onto cuda:0, the next pulls, whole and per fragment, are compressed as the primary's
    answers are, from a mirror on the GPU (a mirror left in host memory could not meet the GPU's weights)."""
    from psrv.server.pulls.copies import PullCopies
    size, keys = 600, (((0, 100), (300, 350)), ((100, 300),))
    fields = {"codec": codec, "resync": 0, "dense": [[10, 30]], "error_feedback": True, "sign_scale": "l1"}
    gen = torch.Generator().manual_seed(6)
    weights = torch.randn(size, generator=gen)
    primary = PullCopies(shard=0)
    primary.greet(0, primary.check(0, fields, size))
    have = primary.answer(0, weights, have=None, final=False)[0]["view"]  # dense: the mirror made
    buf = io.BytesIO()
    torch.save(primary.state_dict(), buf)
    backup = PullCopies(shard=0)
    backup.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), map_location="cpu"), size, device="cuda:0")
    assert backup.copies[0].ref.device.type == "cuda"
    for kind in (-1, 0, -1, 1):
        weights.add_(torch.randn(size, generator=gen) * 0.1)
        on_gpu = weights.to("cuda:0")
        if kind < 0:
            mine, theirs = (primary.answer(0, weights, have=have, final=False),
                            backup.answer(0, on_gpu, have=have, final=False))
        else:
            mine, theirs = (primary.answer_fragment(0, weights, keys[kind], have=have, final=False),
                            backup.answer_fragment(0, on_gpu, keys[kind], have=have, final=False))
        assert "pull_codec" in mine[0] and mine[0] == theirs[0] and theirs[1] is None
        assert mine[2].keys() == theirs[2].keys()
        for k in mine[2]:
            same = torch.allclose if mine[2][k].is_floating_point() else torch.equal
            assert same(mine[2][k], theirs[2][k].cpu()), k
        have = mine[0]["view"]
    assert backup.copies[0].ref.device.type == "cuda"
    torch.testing.assert_close(backup.copies[0].ref.cpu(), primary.copies[0].ref, rtol=1e-5, atol=1e-6)


def test_a_gpu_primarys_state_frame_loads_into_host_memory():
    """psrv/server/replication/stream.py state_from: a "state" op's frame written from a shard on cuda:0 loads onto
    the CPU (map_location), so a backup reads it whatever devices it has, then puts it on its own."""
    from psrv.server.replication import stream
    back = stream.state_from(stream.state_bytes({"weights": torch.arange(4.0, device="cuda:0")}))
    assert back["weights"].device.type == "cpu" and torch.equal(back["weights"], torch.arange(4.0))


def test_a_gpu0_backup_given_a_cpu_primarys_state_keeps_its_pull_mirrors_beside_its_weights():
    """psrv/server/replication/handler.py load_replica_state on a backup whose shard is on cuda:0: the workers'
    compressed-pull mirrors come onto the GPU with the weights (a mirror left in host memory could not meet them in
    a compressed answer), and it answers the next pull as its CPU primary does."""
    import dataclasses

    from psrv.config import ServerConfig
    from psrv.server.replication import stream
    from psrv.server.service import ShardService
    from tests.conformance.test_replica_state import a_primary_mid_clock
    from tests.helpers import RecordingNet
    cfg = ServerConfig(workers=3, mode="sync", optimizer=OptimConfig("sgd", lr=0.1, momentum=0.9))
    primary, _ = a_primary_mid_clock(cfg)
    backup = ShardService(dataclasses.replace(cfg, device="cuda:0"), RecordingNet())
    backup.replication.load_replica_state(stream.state_from(stream.state_bytes(primary.replication.replica_state())),
                                          source="primary P's state")
    assert backup.state.shard.weights.is_cuda
    assert {str(c.ref.device) for c in backup.pulls.copies.copies.values()} == {"cuda:0"}
    torch.testing.assert_close(backup.state.shard.weights.cpu(), primary.state.shard.weights)
