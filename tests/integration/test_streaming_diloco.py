"""Streaming DiLoCo (--fragments F with --local-steps H, --outer-dtype): sync PS equals a single-process
streaming DiLoCo written here from the paper (Douillard et al. 2025: F strided fragments, one synced every H/F
inner steps by its own outer Nesterov, its answer mixed half and half into the local weights one inner step
later; the pseudo-gradients quantised as the outer dtype says); --fragments 1 --outer-dtype float32 is plain
DiLoCo bit for bit; async local SGD with delayed Nesterov learns with fragments. Runs in threads
(tests/threaded_run.py): these are about what is computed, not about processes."""
import json
from collections import Counter

import pytest
import torch

import psrv
from psrv.workers.jobs import load_job
from tests.threaded_run import threaded_run

JOB, BATCH, INNER_LR, OUTER_LR, MOMENTUM = "digits_mlp", 16, 0.01, 0.7, 0.9
OUTER = ("--optimizer", "sgd", "--lr", str(OUTER_LR), "--momentum", str(MOMENTUM), "--nesterov")


def quantised(x: torch.Tensor, outer_dtype: str, block: int = 1024) -> torch.Tensor:
    """x as the servers receive it: bfloat16's rounding, or per block of `block` elements absmax
    quantisation to `levels` = 127 (int8) or 7 (fp4) steps each side, round half to even."""
    if outer_dtype == "float32":
        return x
    if outer_dtype == "bfloat16":
        return x.to(torch.bfloat16).float()
    levels = {"int8": 127, "fp4": 7}[outer_dtype]
    out = torch.empty_like(x)
    for a in range(0, len(x), block):
        piece = x[a:a + block]
        s = piece.abs().max() / levels
        s = torch.where(s == 0, torch.ones_like(s), s)
        out[a:a + block] = torch.round(piece / s).clamp(-levels, levels) * s
    return out


def streaming_diloco(*, workers: int, H: int, F: int, steps: int, outer_dtype: str) -> torch.Tensor:
    """Single-process streaming DiLoCo in sync: the servers' weights at the end, flat."""
    jobs = [load_job(JOB, seed=0) for _ in range(workers)]
    inner = [torch.optim.AdamW(j.model.parameters(), lr=INNER_LR) for j in jobs]
    batches = [j.batches_for(rank=r, world_size=workers, batch_size=BATCH, seed=0) for r, j in enumerate(jobs)]
    local = [list(j.model.parameters()) for j in jobs]
    glob = [p.detach().clone() for p in local[0]]                       # the servers' weights
    base = [[p.detach().clone() for p in ps] for ps in local]           # each worker's weights at its last sync
    fragment = [list(range(f, len(glob), F)) for f in range(F)]          # strided by tensor
    outer = [torch.optim.SGD([glob[i] for i in fragment[f]], lr=OUTER_LR, momentum=MOMENTUM, nesterov=True)
             for f in range(F)]                                          # one outer optimizer per fragment

    def sync(f: int) -> None:
        deltas = [quantised(torch.cat([(base[m][i] - local[m][i].detach()).reshape(-1) for i in fragment[f]]),
                            outer_dtype) for m in range(workers)]
        mean, at = sum(deltas) / workers, 0
        for i in fragment[f]:
            glob[i].grad = mean[at:at + glob[i].numel()].view_as(glob[i]).clone()
            at += glob[i].numel()
        outer[f].step()

    def merge(f: int) -> None:
        with torch.no_grad():
            for m in range(workers):
                for i in fragment[f]:
                    local[m][i].copy_(local[m][i].mul(0.5).add(glob[i], alpha=0.5))
                    base[m][i] = glob[i].clone()

    pushes, in_flight = 0, None
    for k in range(1, steps + 1):
        for job, opt, stream in zip(jobs, inner, batches):
            opt.zero_grad()
            job.loss_of(job.model, next(stream)).backward()
            opt.step()
        if in_flight is not None:                                        # the answer of the last step's push
            merge(in_flight)
            in_flight = None
        if k % (H // F) == 0:
            in_flight = pushes % F
            sync(in_flight)
            pushes += 1
    if in_flight is not None:                                            # close(): the fragment in flight,
        merge(in_flight)
    if steps % (H // F):                                                 # then the steps not pushed yet
        sync(pushes % F)
    return torch.cat([g.reshape(-1) for g in glob])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("servers,outer_dtype,F,H,steps", [(1, "int8", 2, 4, 13), (1, "fp4", 2, 6, 12),
                                                            (2, "float32", 4, 4, 10), (2, "bfloat16", 2, 4, 9)])
def test_sync_equals_single_process_streaming_diloco(servers, outer_dtype, F, H, steps, tmp_path):
    summary = threaded_run(tmp_path, "--job", JOB, "--mode", "sync", "--workers", "2", "--servers", str(servers),
                           "--steps", str(steps), "--batch-size", str(BATCH), "--local-steps", str(H),
                           "--fragments", str(F), "--outer-dtype", outer_dtype, "--inner-lr", str(INNER_LR), *OUTER)
    want = streaming_diloco(workers=2, H=H, F=F, steps=steps, outer_dtype=outer_dtype)
    start = torch.cat([p.detach().reshape(-1) for p in load_job(JOB, seed=0).model.parameters()])
    assert (want - start).abs().max() > 1e-2                                     # the reference really moved
    torch.testing.assert_close(torch.load(tmp_path / "params.pt"), want, rtol=0, atol=1e-5)
    per_worker = -(-steps // (H // F))
    assert (summary["pushes"], summary["inner_steps"]) == (2 * per_worker, 2 * steps), summary


@pytest.mark.timeout(120)
def test_one_fragment_in_float32_is_plain_diloco_bit_for_bit(tmp_path):
    common = ("--job", JOB, "--mode", "sync", "--workers", "2", "--servers", "2", "--steps", "12", "--batch-size",
              str(BATCH), "--local-steps", "4", "--inner-lr", str(INNER_LR), *OUTER)
    threaded_run(tmp_path / "plain", *common)
    threaded_run(tmp_path / "streaming", *common, "--fragments", "1", "--outer-dtype", "float32")
    assert torch.equal(torch.load(tmp_path / "plain" / "params.pt"), torch.load(tmp_path / "streaming" / "params.pt"))


@pytest.mark.timeout(120)
def test_async_local_sgd_with_delayed_nesterov_learns_on_fragments(tmp_path):
    # 2 fragments of H = 10, 4-bit outer gradients: 8 fragment pushes a worker. Three runs here ended at
    # eval accuracy 0.88 to 0.89 (async order varies), from about 0.08 at the start.
    summary = threaded_run(tmp_path, "--job", JOB, "--mode", "async", "--workers", "2", "--servers", "2",
                           "--steps", "40", "--batch-size", str(BATCH), "--local-steps", "10", "--fragments", "2",
                           "--outer-dtype", "fp4", "--inner-lr", str(INNER_LR), *OUTER, "--update-rule", "dn")
    assert summary["eval_accuracy"] >= 0.75, summary
    assert (summary["pushes"], summary["updates_applied"]) == (16, 16), summary
    assert summary["compression_ratio"] > 7, summary                     # 4 bits + a scale per 1024 of 32 bits


def test_bad_combinations_are_refused_in_one_line():
    from psrv.config import RunConfig, from_dict
    for worker, message in [({"fragments": 2}, r"^worker\.fragments: splits the pushes of local steps"),
                            ({"local_steps": 6, "fragments": 4}, r"^worker\.fragments: 4 must divide local_steps 6"),
                            ({"outer_dtype": "int8"}, r"^worker\.outer_dtype: quantises the pseudo-gradients"),
                            ({"local_steps": 4, "outer_dtype": "int8", "compress": "sign"},
                             r"^worker\.outer_dtype: is the push codec of local steps")]:
        with pytest.raises(ValueError, match=message):
            from_dict(RunConfig, {"worker": worker})
    for tree, message in [({"mode": "async", "optimizer": {"update_rule": "dc-asgd"}},
                           r"^optimizer\.update_rule: 'dc-asgd' corrects by each worker's pulled weights"),
                          ({"optimizer": {"clip_grad_norm": 1.0}, "cluster": {"servers": 1}},
                           r"^optimizer\.clip_grad_norm: clips by the global norm; fragments push one")]:
        with pytest.raises(ValueError, match=message):
            from_dict(RunConfig, {**tree, "worker": {"local_steps": 4, "fragments": 2}})
    with pytest.raises(ValueError, match=r"^worker\.fragments: is for the parameter server"):
        from_dict(RunConfig, {"mode": "ddp", "worker": {"local_steps": 4, "fragments": 2}})
    with pytest.raises(ValueError, match=r"^fragments must be in 1\.\.2 \(this model's parameter tensors"):
        psrv.Worker(torch.nn.Linear(2, 1), ["tcp://127.0.0.1:9"], rank=0, world_size=1, local_steps=4, fragments=4)
    with pytest.raises(ValueError, match=r"^fragments: 3 must divide local_steps 4"):
        psrv.Worker(torch.nn.Linear(2, 1), ["tcp://127.0.0.1:9"], rank=0, world_size=1, local_steps=4, fragments=3)


@pytest.mark.timeout(60)
def test_each_fragment_push_has_its_staleness_in_its_own_row(tmp_path):
    # H/F = 2: a fragment push's answer is merged at the next step, which pushes nothing. Its staleness once
    # landed on that step's row, and the summary (pushing rows only) said 0 beside a shard histogram of mean 0.9.
    summary = threaded_run(tmp_path, "--job", "tests/conformance/job.py:tiny", "--mode", "async", "--workers", "2",
                           "--servers", "1", "--steps", "16", "--batch-size", "16", "--local-steps", "4",
                           "--fragments", "2", "--inner-optimizer", "sgd", "--inner-lr", "0.05")
    hist = Counter({int(k): v for k, v in json.loads((tmp_path / "server-0.json").read_text())["staleness_histogram"].items()})
    rows = [r for w in range(2) for r in json.loads((tmp_path / f"worker-{w}.json").read_text())["step_log"]]
    assert max(hist) > 0, hist  # two workers pushing in turn: a push is stale by the other's
    assert Counter(r["staleness"] for r in rows if r["pushed"]) == hist  # 16 steps: every push has a row
    assert all(r["staleness"] == 0 for r in rows if not r["pushed"]), rows
    assert summary["max_staleness"] == max(hist), summary
    assert summary["mean_staleness"] == pytest.approx(sum(k * v for k, v in hist.items()) / 16), summary
