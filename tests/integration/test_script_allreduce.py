"""One psrv.Worker script under the parameter server and under the all-reduce modes: `psrv run --mode sync
--script` and `psrv run --mode ddp|zero1 --script` train the same loop (script_loop.py) to the same weights,
those of single-process SGD on the global batch with the run's clip and warm-up, and write steps.csv and
summary.json from the script's own steps."""
import csv
import json
from pathlib import Path

import pytest
import torch

from tests.helpers import psrv_run
from tests.integration import user_loop
from tests.reference_sgd import clipped_warmup_sgd

SCRIPT = Path(__file__).with_name("script_loop.py")  # user_loop's data and model; step(loss=, batch_size=)
WORKERS, STEPS, LR, MOMENTUM, CLIP, WARMUP = 2, 12, 0.1, 0.9, 0.5, 4
OPTIONS = ("--workers", str(WORKERS), "--lr", str(LR), "--momentum", str(MOMENTUM), "--clip-grad-norm", str(CLIP),
           "--warmup-steps", str(WARMUP), "--steps", str(STEPS))


def _global_batch_sgd_clipped(steps: int) -> tuple[torch.Tensor, int]:
    """Single-process SGD over user_loop's model, each step one batch of both ranks' batches (mean loss),
    clipped to CLIP and at the linear warm-up's lr (update k < N: lr*(k+1)/(N+1)); the final flat
    parameters and the number of steps whose gradient the clip shortened."""
    data, net = user_loop.dataset(), user_loop.model()
    samplers = [torch.utils.data.DistributedSampler(data, num_replicas=WORKERS, rank=r, shuffle=True, seed=0)
                for r in range(WORKERS)]
    loaders = [iter(torch.utils.data.DataLoader(data, batch_size=user_loop.BATCH, sampler=s)) for s in samplers]
    batches = (tuple(torch.cat(t) for t in zip(*(next(it) for it in loaders))) for _ in range(steps))
    return clipped_warmup_sgd(net, batches, lr=LR, momentum=MOMENTUM, clip=CLIP, warmup=WARMUP)


def _rows(out: Path) -> list[dict]:
    with open(out / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(300)
def test_one_script_trains_to_the_same_weights_under_sync_ddp_and_zero1(tmp_path):
    # stays slow (3 runs of psrv run, 7 processes): a user's script under each launcher is a process by nature
    summaries = {}
    for mode in ("sync", "ddp", "zero1"):
        servers = ("--servers", "1") if mode == "sync" else ()  # sync clips at its one server
        summaries[mode] = psrv_run(tmp_path / mode, "--mode", mode, *servers, *OPTIONS,
                                   "--script", str(SCRIPT), "1", str(tmp_path / f"{mode}.pt"))
    want, clipped = _global_batch_sgd_clipped(STEPS)
    initial = torch.cat([p.detach().reshape(-1) for p in user_loop.model().parameters()])
    assert (want - initial).abs().max() > 1e-2 and 0 < clipped                    # it moved, and the clip bit
    finals = {mode: torch.load(tmp_path / mode / "params.pt") for mode in summaries}
    for mode, final in finals.items():
        torch.testing.assert_close(final, want, rtol=0, atol=1e-5, msg=f"{mode} against the reference")
        torch.testing.assert_close(torch.load(tmp_path / f"{mode}.pt"), final, rtol=0, atol=0)  # the script's own
    torch.testing.assert_close(finals["ddp"], finals["sync"], rtol=0, atol=1e-5)
    torch.testing.assert_close(finals["zero1"], finals["sync"], rtol=0, atol=1e-5)

    for mode in ("ddp", "zero1"):
        s, out = summaries[mode], tmp_path / mode
        assert (s["mode"], s["transport"], s["num_servers"], s["num_workers"]) == (mode, "gloo", 0, WORKERS)
        assert (s["job"], s["script_args"], s["steps"], s["batch_size"]) == (
            str(SCRIPT), ["1", str(tmp_path / f"{mode}.pt")], STEPS, user_loop.BATCH)
        assert s["pushes"] == WORKERS * STEPS and s["updates_applied"] == STEPS  # a collective per rank's step
        assert (s["max_staleness"], s["mean_staleness"], s["final_loss"], s["seed"]) == (None, None, None, 0)
        assert s["samples_per_second"] > 0
        rows = _rows(out)
        assert len(rows) == WORKERS * STEPS
        for rank in range(WORKERS):
            record = json.loads((out / f"worker-{rank}.json").read_text())
            assert (record["mode"], record["backend"], record["rank"], record["world_size"]) == (mode, "gloo", rank,
                                                                                                WORKERS)
            assert (record["pushes"], record["updates_applied"], record["steps"]) == (STEPS, STEPS, STEPS)
            mine = sorted((r for r in rows if r["worker"] == str(rank)), key=lambda r: int(r["step"]))
            assert [int(r["step"]) for r in mine] == list(range(STEPS))
            losses = json.loads((tmp_path / f"{mode}.pt.losses-{rank}.json").read_text())  # the script's own
            assert [float(r["loss"]) for r in mine] == losses
            assert {(r["staleness"], r["pushed"], r["batch_size"]) for r in mine} == {("", "", str(user_loop.BATCH))}
            assert all(float(r["wait_seconds"]) >= 0 and float(r["compute_seconds"]) > 0 for r in mine)
        by_step = {}
        for r in rows:  # the wait is split out after the run: at each step the fastest rank waited none
            by_step.setdefault(r["step"], []).append(float(r["wait_seconds"]))
        assert all(min(waits) == 0.0 for waits in by_step.values())
