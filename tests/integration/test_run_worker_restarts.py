"""psrv run --restart-workers (experiments/launcher/worker_restarts.py): a worker SIGKILLed by --kill-worker comes back
with its rank, rejoins a sync DiLoCo run at the clock after the open one, runs to the run's end, and the
survivor never waits for its start-up or its first round; a worker that keeps dying ends the run in one line."""
from __future__ import annotations

import csv
import json
import re

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.cluster import RunFailed
from psrv.experiments.launcher.launch import run_local
from psrv.experiments.launcher.summary import format_summary
from psrv.workers.jobs import load_job

# 10 rounds of 2 s: the survivor trains about 20 s, so the killed worker's restart (a process start that
# took over 6 s on 2 loaded cores in CI, at 5 rounds) still joins with rounds left to push
H, CLOCKS = 20, 10
STEPS = H * CLOCKS
TIMEOUT = 1.0  # --worker-timeout: how long the survivor may wait for the dead worker, no more


def _config(**more) -> RunConfig:
    # 100 ms of emulated compute per inner step: a round of H steps is 2 s, longer than the dead worker's
    # detection, so a survivor held for the rejoiner's first round would wait a good part of it
    return from_dict(RunConfig, {"mode": "sync", "cluster": {"servers": 1, "workers": 2},
                                 "job": {"name": "digits_mlp", "steps": STEPS},
                                 "worker": {"local_steps": H}, "faults": {"compute_ms": 100.0},
                                 "server": {"worker_timeout": TIMEOUT}, **more})


def _rows(path) -> dict[int, list[dict]]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return {rank: [{k: float(v) if k not in ("pushed",) else v == "True" for k, v in r.items()}
                   for r in rows if int(r["worker"]) == rank] for rank in (0, 1)}


@pytest.mark.timeout(120)
def test_a_killed_worker_comes_back_runs_to_the_end_and_never_holds_the_survivor(tmp_path):
    summary = run_local(_config(kill={"worker": "1:20"}, restarts={"workers": 1}), out=tmp_path,
                        progress=False, timeout=90)
    [restart] = summary["faults"]["worker_restarts"]
    assert restart["rank"] == 1 and restart["signal"] == "SIGKILL" and restart["exit_code"] == -9
    assert restart["joined"] and restart["life"] == 2 and "--kill-worker 1:20" in restart["cause"]
    assert (tmp_path / "worker-1.log.1").exists()  # the killed life's log is kept beside the new one's

    server = json.loads((tmp_path / "server-0.json").read_text())
    assert server["updates_applied"] == CLOCKS  # every clock committed once
    assert (tmp_path / "worker-1.json").exists(), "the restarted worker wrote no record"
    joined = json.loads((tmp_path / "worker-1.json").read_text())["step_log"]
    assert joined, f"the restart joined after the survivor's last round: {restart}"  # a start-up over ~18 s
    assert server["clocks"] == {"0": CLOCKS, "1": CLOCKS}  # the restarted worker pushed up to the last clock

    rows = _rows(tmp_path / "steps.csv")
    survivor, rejoiner = rows[0], rows[1]
    assert [int(r["step"]) for r in survivor] == list(range(STEPS))
    first = int(rejoiner[0]["step"])  # where it joined: a clock's first inner step, then on to the run's end
    assert first % H == 0 and 0 < first < STEPS and [int(r["step"]) for r in rejoiner] == list(range(first, STEPS))
    record = json.loads((tmp_path / "worker-1.json").read_text())
    assert record["pushes"] == (STEPS - first) // H and summary["complete"]

    began = rejoiner[0]["wall_time"] - rejoiner[0]["compute_seconds"] - rejoiner[0]["wait_seconds"] \
        - rejoiner[0]["communication_seconds"]  # the rejoiner's first inner step began (it had pulled)
    first_round = next(r for r in rejoiner if r["pushed"])["wall_time"] - began
    longest = max(r["wait_seconds"] for r in survivor)
    after = max(r["wait_seconds"] for r in survivor if r["wall_time"] > began)
    print(f"\nrejoined at step {first}; rejoiner's first round {first_round:.2f}s; survivor's longest wait "
          f"{longest:.2f}s, since the rejoiner began {after:.2f}s")
    assert longest < TIMEOUT + 0.5  # the dead worker's detection at most: nothing of the restart's start-up
    assert after < first_round / 4  # and nothing of its first round: it pushes the clock after the open one
    # the killed life's steps are in no record: summary.json and the printed summary say how many
    assert summary["faults"]["unrecorded_steps"] == restart["rank_steps"] >= 10
    assert summary["pushes"] == sum(json.loads((tmp_path / f"worker-{r}.json").read_text())["pushes"] for r in (0, 1))
    table = format_summary(summary)
    assert re.search(rf"^restarted +worker-1 at worker 0's step \d+ \(the killed lives' {restart['rank_steps']} steps "
                     r"wrote no record: not in samples/s, pushes or steps.csv\)$", table, re.M), table


@pytest.mark.timeout(120)
def test_rank_0_comes_back_too_and_still_writes_the_final_weights(tmp_path):
    summary = run_local(_config(kill={"worker": "0:20"}, restarts={"workers": 1}), out=tmp_path,
                        progress=False, timeout=90)
    [restart] = summary["faults"]["worker_restarts"]
    assert restart["rank"] == 0 and restart["joined"] and restart["step"] >= 20
    record = json.loads((tmp_path / "worker-0.json").read_text())
    first = record["step_log"][0]["step"]
    assert 0 < first < STEPS and record["step_log"][-1]["step"] == STEPS - 1
    job = load_job("digits_mlp", seed=0)  # the run's initial weights: the job's, seeded; rank 0 sent them
    assert [e["step"] for e in record["evals"]] == [0, STEPS]
    assert summary["initial_loss"] == pytest.approx(job.evaluate_on(job.model, device=torch.device("cpu"))["loss"])
    final = torch.load(tmp_path / "params.pt")  # written by the restarted rank 0 after every worker's last push
    assert final.shape == parameters_to_vector(job.model.parameters()).shape
    assert json.loads((tmp_path / "server-0.json").read_text())["updates_applied"] == CLOCKS
    assert summary["final_loss"] < summary["initial_loss"]


CRASHING = """
import torch
from psrv.workers.jobs import Job


def make(seed):
    x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))

    def batches(*, rank, world_size, batch_size, seed):
        for i in range(10 ** 9):
            if rank == 1 and i == 3:
                raise RuntimeError("rank 1 crashes at its fourth batch, every life")
            yield x[:batch_size], y[:batch_size]

    def evaluate(model):
        return {"loss": float(torch.nn.functional.cross_entropy(model(x), y))}

    return Job("crashing", torch.nn.Linear(8, 2), batches=batches,
               loss=lambda model, b: torch.nn.functional.cross_entropy(model(b[0]), b[1]), evaluate=evaluate)
"""


@pytest.mark.timeout(120)
def test_a_worker_that_keeps_dying_ends_the_run_in_one_line(tmp_path):
    """Rank 1 crashes a few steps into each life: restarted once (--restart-workers 1), it crashes again and
    the run ends with one line saying so, while rank 0 still trains."""
    job = tmp_path / "crashing.py"
    job.write_text(CRASHING)
    cfg = from_dict(RunConfig, {"mode": "sync", "cluster": {"servers": 1, "workers": 2},
                                "job": {"name": f"{job}:make", "steps": 100_000}, "faults": {"compute_ms": 20.0},
                                "restarts": {"workers": 1}})
    with pytest.raises(RunFailed) as failed:
        run_local(cfg, out=tmp_path / "run", progress=False, timeout=90)
    line = str(failed.value)
    assert "\n" not in line and line.startswith("worker-1 (rank 1) exited with code 1; it was restarted 1 times")
    assert "the most --restart-workers 1 allows" in line
    assert (tmp_path / "run" / "worker-1.log.1").exists() and "fourth batch" in (tmp_path / "run" / "worker-1.log").read_text()
