"""Compressed pulls in a running cluster (threads: tests/conformance/cluster.py, the conformance matrix's
fixed-order runs of its tiny job): top-k at ratio 1 gives the dense pulls' weights bit for bit under every
mode; error feedback on both sides (the worker's push residual, the shard's pull residual) equals the
single-process reference of DoubleSqueeze/DORE to 1e-5 in sync; the worker's copy is the shard's mirror
bit for bit mid-run, and rank 0 ends on the shard's exact weights. The same for streaming DiLoCo's fragment
pulls: top-k at ratio 1 is dense bit for bit, and the system equals the streaming reference with compressed
fragment pulls (tests/conformance/ref_streaming.py) to 1e-5 in sync."""
from __future__ import annotations

import pytest
import torch

from psrv.config import RunConfig, from_dict, to_dict
from psrv.server.run import Server
from psrv.client import Worker
from tests.conformance import job as tiny
from tests.conformance.axes import DEFAULT, run_config
from tests.conformance.cluster import run
from tests.conformance.ref_streaming import reference_of
from tests.conformance.test_matrix import check


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: the weights to the last bit depend on the thread count (as in the matrix)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _with_pull(cfg: RunConfig, spec: str) -> RunConfig:
    tree = to_dict(cfg)
    tree["worker"]["compress_pull"] = spec
    return from_dict(RunConfig, tree)


@pytest.mark.parametrize("mode, shards", [("sync", 1), ("async", 2), ("ssp", 1)])
def test_topk_at_ratio_one_equals_dense_pulls_bit_for_bit(mode, shards):
    cfg = run_config({**DEFAULT, "mode": mode, "shards": shards, "codec": "sign"})
    dense = run(cfg, nan=False).params
    identity = run(_with_pull(cfg, "topk:1"), nan=False)
    assert torch.equal(identity.params, dense), f"{(identity.params - dense).abs().max():.3g} from dense pulls"


@pytest.mark.parametrize("codec", ["sign", "topk"])
def test_bidirectional_error_feedback_equals_the_reference_in_sync(codec):
    """1 shard, 2 workers, the same codec both ways, a resync inside the run: weights to 1e-5, counts exact."""
    check({**DEFAULT, "mode": "sync", "codec": codec, "pull": codec})


def test_the_workers_copy_is_the_shards_mirror_and_the_run_ends_on_its_weights():
    cfg = run_config({**DEFAULT, "mode": "async", "pull": "sign", "codec": "sign"}, workers=1)
    job = tiny.tiny(cfg.seed)
    with Server(cfg.server_config(0, bind="tcp://127.0.0.1:0")) as server:
        server.start()
        ps = Worker(job.model, [server.address], rank=0, world_size=1, timeout=30.0, compress="sign",
                    compress_pull="sign", pull_resync=0)
        try:
            batches = job.batches_for(rank=0, world_size=1, batch_size=16, seed=cfg.seed)
            for _ in range(4):
                job.loss_of(job.model, next(batches)).backward()
                ps.step()
            service = server.service
            copy, mirror = ps._client.pull_view.copy, service.pulls.copies.copies[0].ref
            weights = service.shard.weights
            assert torch.equal(copy, mirror)  # so copy - weights is exactly the residual the shard keeps
            assert (copy - weights).abs().max() > 0  # the pulls were compressed: there is a residual
            assert ps._client.pull_view.compressed_replies == 4
            model = torch.cat([p.detach().view(-1) for p in job.model.parameters()])
            assert torch.equal(model, copy)
            pulled = ps.wire_bytes()["bytes_pulled"]
        finally:
            ps.close()  # rank 0's final pull is dense: the shard's exact weights
        model = torch.cat([p.detach().view(-1) for p in job.model.parameters()])
        assert torch.equal(model, service.shard.weights)
        assert pulled < 2.5 * 4 * model.numel()  # the first pull dense, four signs: far under five dense pulls


def test_an_outer_dtype_leaves_the_pulls_small_tensors_exact():
    """--outer-dtype fp4 sends every tensor through the push's codec, small ones too; the pulls keep
    compress_min_numel: the 10-element bias is pulled as the shard's weights, the rest by its sign change."""
    cfg = run_config({**DEFAULT, "mode": "async", "pull": "sign", "local": 2, "outer": "fp4"}, workers=1)
    job = tiny.tiny(cfg.seed)
    bias = job.model[-1].bias.numel()
    assert bias < cfg.worker.compress_min_numel < job.model[-1].weight.numel()
    with Server(cfg.server_config(0, bind="tcp://127.0.0.1:0")) as server:
        server.start()
        ps = Worker(job.model, [server.address], rank=0, world_size=1, timeout=30.0, local_steps=2, outer_dtype="fp4",
                    compress_pull="sign", pull_resync=0, compress_min_numel=cfg.worker.compress_min_numel)
        inner = torch.optim.SGD(job.model.parameters(), lr=0.05)
        try:
            batches = job.batches_for(rank=0, world_size=1, batch_size=16, seed=cfg.seed)
            for _ in range(6):  # three pushes, each answered by a compressed pull
                inner.zero_grad()
                job.loss_of(job.model, next(batches)).backward()
                inner.step()
                ps.step()
            copy, weights = ps._client.pull_view.copy, server._service.shard.weights
            assert ps._client.pull_view.compressed_replies == 3
            assert torch.equal(copy[-bias:], weights[-bias:])  # pulled exactly
            assert (copy[:-bias] - weights[:-bias]).abs().max() > 0  # the rest by sign: a residual
        finally:
            ps.close()


def _longer(case: dict, *, pull: str | None = None) -> RunConfig:
    """A streaming DiLoCo case of the matrix run longer, with a larger outer lr, so that how its pulls were
    compressed shows in the final weights far above 1e-5 (at the matrix's 4 steps it stays under)."""
    tree = to_dict(run_config(case))
    tree["job"]["steps"], tree["optimizer"]["lr"], tree["worker"]["inner_lr"] = 12, 0.5, 0.1
    if pull is not None:
        tree["worker"]["compress_pull"] = pull
    return from_dict(RunConfig, tree)


@pytest.mark.parametrize("mode, shards", [("sync", 1), ("async", 2), ("ssp", 1)])
def test_fragment_pulls_of_topk_at_ratio_one_equal_dense_fragment_pulls_bit_for_bit(mode, shards):
    case = {**DEFAULT, "mode": mode, "shards": shards, "local": 2, "fragments": 2, "outer": "int8"}
    dense = run(_longer(case), nan=False).params
    identity = run(_longer(case, pull="topk:1"), nan=False).params
    assert torch.equal(identity, dense), f"{(identity - dense).abs().max():.3g} from dense fragment pulls"


@pytest.mark.parametrize("pull, ef", [("sign", "on"), ("topk", "on"), ("sign", "off")])
def test_streaming_diloco_with_compressed_fragment_pulls_equals_the_reference_in_sync(pull, ef):
    """2 workers, 2 fragments pushed in turn, each fragment's pulls compressed with the shard's residual (its
    third pull a resync): the system's weights equal the single-process reference's to 1e-5, where dense
    pulls would end far from them."""
    case = {**DEFAULT, "mode": "sync", "local": 2, "fragments": 2, "pull": pull, "ef": ef}
    cfg = _longer(case)
    got = run(cfg, nan=False).params
    want = reference_of(cfg, nan=False).run().params
    assert torch.allclose(got, want, atol=1e-5, rtol=0), f"{(got - want).abs().max():.3g} from the reference"
    dense = reference_of(_longer({**case, "pull": "none", "ef": "on"}), nan=False).run().params
    assert (want - dense).abs().max() > 1e-4  # the comparison above would see dense pulls


def test_a_backup_keeps_the_same_fragment_mirrors_as_its_primary():
    """--replicas 1 on 3 shards: each backup answers the fragment pulls as its primary does and ends with its
    state leaf by leaf, the copies' mirrors and which fragments they know included (check_backups)."""
    check({**DEFAULT, "mode": "async", "replicas": 1, "shards": 3, "local": 2, "fragments": 2, "pull": "sign"})
