"""Local SGD and DiLoCo (--local-steps): each worker takes H steps of its own inner optimizer, then
pushes w_pulled - w_now for the servers' outer optimizer. Sync PS and the DDP baseline both equal a
single-process DiLoCo; H = 1 with outer SGD at lr 1 is the inner optimizer alone; --local-steps 1
with no inner optimizer is today's push of the gradient; async local SGD learns.

The runs about what is computed use `psrv run`'s cluster as threads of the test process
(tests/threaded_run.py); DDP and the RPC transport need processes of their own and stay `psrv run`."""
import json

import pytest
import torch

import psrv
from psrv.config import RunConfig, from_dict
from tests.helpers import psrv_run
from tests.threaded_run import threaded_run
from tests.integration.test_sync_reference import big_batch_sgd
from psrv.workers.jobs import load_job

JOB, BATCH = "digits_mlp", 16
H, ROUNDS, INNER_LR, OUTER = 5, 3, 0.01, ("--optimizer", "sgd", "--lr", "0.7", "--momentum", "0.9", "--nesterov")


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def diloco(*, workers: int, local_steps: int, rounds: int, outer_lr: float, momentum: float, nesterov: bool,
           inner_lr: float = INNER_LR) -> torch.Tensor:
    """Single-process DiLoCo: from the same start, each rank's AdamW (state kept across rounds) takes
    `local_steps` steps on that rank's batches; the mean of w_start - w_rank is one outer SGD step."""
    jobs = [load_job(JOB, seed=0) for _ in range(workers)]
    inner = [torch.optim.AdamW(j.model.parameters(), lr=inner_lr) for j in jobs]
    batches = [j.batches_for(rank=r, world_size=workers, batch_size=BATCH, seed=0) for r, j in enumerate(jobs)]
    shared = [p.detach().clone() for p in jobs[0].model.parameters()]
    outer = torch.optim.SGD(shared, lr=outer_lr, momentum=momentum, nesterov=nesterov)
    for _ in range(rounds):
        for job, opt, stream in zip(jobs, inner, batches):
            with torch.no_grad():
                for p, s in zip(job.model.parameters(), shared):
                    p.copy_(s)
            for _ in range(local_steps):
                opt.zero_grad()
                job.loss_of(job.model, next(stream)).backward()
                opt.step()
        for k, s in enumerate(shared):
            s.grad = sum(s - list(j.model.parameters())[k].detach() for j in jobs) / workers
        outer.step()
    return torch.cat([s.reshape(-1) for s in shared])


@pytest.mark.timeout(120)
def test_h1_with_outer_sgd_lr1_is_the_inner_optimizer_alone(tmp_path):
    steps = 20
    summary = threaded_run(tmp_path, "--job", JOB, "--mode", "sync", "--workers", "1", "--servers", "1", "--steps",
                           str(steps), "--batch-size", str(BATCH), "--local-steps", "1", "--inner-optimizer", "adamw",
                           "--inner-lr", str(INNER_LR), "--optimizer", "sgd", "--lr", "1", "--momentum", "0")
    want = diloco(workers=1, local_steps=1, rounds=steps, outer_lr=1.0, momentum=0.0, nesterov=False)
    assert (want - flat(load_job(JOB, seed=0).model)).abs().max() > 1e-2      # the reference really moved
    torch.testing.assert_close(torch.load(tmp_path / "params.pt"), want, rtol=0, atol=1e-6)
    assert (summary["pushes"], summary["inner_steps"]) == (steps, steps), summary


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["sync", "ddp"])
def test_two_workers_equal_single_process_diloco(mode, tmp_path):
    run = threaded_run if mode == "sync" else psrv_run  # DDP's ranks: a process group, one rank per process
    summary = run(tmp_path, "--job", JOB, "--mode", mode, "--workers", "2", "--servers", "1",
                  "--steps", str(H * ROUNDS), "--batch-size", str(BATCH), "--local-steps", str(H),
                  "--inner-lr", str(INNER_LR), *OUTER)
    want = diloco(workers=2, local_steps=H, rounds=ROUNDS, outer_lr=0.7, momentum=0.9, nesterov=True)
    torch.testing.assert_close(torch.load(tmp_path / "params.pt"), want, rtol=0, atol=1e-5)
    assert (summary["pushes"], summary["inner_steps"], summary["updates_applied"]) == (2 * ROUNDS, 2 * H * ROUNDS,
                                                                                       ROUNDS), summary
    assert summary["pushes_per_sample"] == pytest.approx(1 / (H * BATCH)) and summary["pseudo_grad_norm"] > 0


@pytest.mark.timeout(120)
def test_local_steps_1_without_an_inner_optimizer_pushes_the_gradient_as_before(tmp_path):
    summary = threaded_run(tmp_path, "--mode", "sync", "--workers", "3", "--servers", "1", "--steps", "20",
                           "--batch-size", "16", "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
                           "--local-steps", "1")
    ran = from_dict(RunConfig, json.loads((tmp_path / "config.json").read_text()))
    assert ran.worker == from_dict(RunConfig, {}).worker                       # the very config of a run without it
    torch.testing.assert_close(torch.load(tmp_path / "params.pt"), big_batch_sgd(), rtol=0, atol=1e-5)
    assert "inner_steps" not in summary and summary["pushes"] == 60


@pytest.mark.timeout(180)
def test_async_local_sgd_learns(tmp_path):
    # Outer SGD lr 1 without momentum: each pseudo-gradient applied as it comes. With outer momentum 0.5
    # and 100 steps, three runs here ended at 0.68, 0.69 and 0.92 (async order varies); these
    # settings ended at 0.947, 0.950 and 0.947.
    summary = threaded_run(tmp_path, "--mode", "async", "--workers", "2", "--servers", "2", "--steps", "150",
                           "--local-steps", "5", "--inner-lr", "0.003", "--optimizer", "sgd", "--lr", "1.0",
                           "--momentum", "0")
    assert summary["eval_accuracy"] >= 0.8, summary                           # from about 0.08 at the start
    assert summary["final_loss"] < 0.25 * summary["initial_loss"], summary
    assert (summary["pushes"], summary["inner_steps"]) == (60, 300), summary


@pytest.mark.timeout(120)
def test_local_steps_over_rpc(tmp_path):
    # the inner optimizer is made before the RPC world is joined (torch.optim imports torch._dynamo,
    # which after joining left the shards unreachable). Real processes: one RPC world per process, and a
    # fresh one shows the import order (the test process may have imported torch._dynamo already)
    summary = psrv_run(tmp_path, "--mode", "async", "--transport", "rpc", "--workers", "1", "--servers", "1",
                       "--steps", "10", "--local-steps", "5")
    assert (summary["pushes"], summary["inner_steps"], summary["updates_applied"]) == (2, 10, 2), summary


def test_local_steps_settings_resolve_and_refuse_in_one_line():
    worker = from_dict(RunConfig, {"worker": {"local_steps": 20}}).worker
    assert (worker.inner_optimizer, worker.inner_lr, worker.local_updates) == ("adamw", 0.001, True)
    assert from_dict(RunConfig, {"worker": {"inner_optimizer": "sgd"}}).worker.inner_lr == 0.05
    with pytest.raises(ValueError, match=r"^worker\.inner_lr: needs local_steps > 1 or an inner_optimizer"):
        from_dict(RunConfig, {"worker": {"inner_lr": 0.1}})
    with pytest.raises(ValueError, match=r"^worker\.local_steps: must be >= 1"):
        from_dict(RunConfig, {"worker": {"local_steps": 0}})
    with pytest.raises(ValueError, match=r"^local_steps: must be >= 1"):
        psrv.Worker(torch.nn.Linear(2, 1), ["tcp://127.0.0.1:9"], rank=0, world_size=1, local_steps=0)


@pytest.mark.timeout(180)
def test_the_staleness_plot_counts_pushes_only(tmp_path):
    """With local steps a row is an inner step; only every H-th pushed. steps.csv says which on every row
    (`pushed`), and the staleness plot draws the pushes' staleness: its mean is summary.json's."""
    from psrv.experiments.harness.collect import merge_variant, read_csv
    from psrv.experiments.harness.plots.figure import VariantData
    from psrv.experiments.harness.plots.staleness import staleness_values
    run = tmp_path / "async" / "rep-0"
    summary = threaded_run(run, "--mode", "async", "--workers", "2", "--servers", "1", "--steps", "40",
                           "--local-steps", "4", "--compute-ms", "5")
    rows = read_csv(run / "steps.csv")
    assert [r.get("pushed") for r in rows].count("True") == summary["pushes"] == 20, rows[:5]
    assert {r["pushed"] for r in rows} == {"True", "False"} and len(rows) == summary["inner_steps"] == 80
    merge_variant(tmp_path, "async", [(0, run)])
    data = VariantData(name="async", mode="async", steps=read_csv(tmp_path / "async" / "steps.csv"),
                       evals=[], updates={0: summary["updates_applied"]})
    plotted = staleness_values(data)
    assert summary["mean_staleness"] > 0, summary                   # async with 2 workers: some is stale
    assert (len(plotted), sum(plotted) / len(plotted)) == pytest.approx((20, summary["mean_staleness"])), \
        (len(plotted), sum(plotted) / len(plotted), summary["mean_staleness"])
