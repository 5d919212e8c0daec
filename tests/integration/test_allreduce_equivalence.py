"""The all-reduce baselines against sync PS (issue 17): with SGD, with and without momentum, sync PS
(2 workers; 1 server, or 2 with momentum), DDP, FSDP and ZeRO-1 end with the same parameters after 20
steps on the same data, to 1e-5, each all-reduce run through the launcher `psrv run` calls, its ranks
processes of one process group, and sync PS, the reference they are held against, in threads of the
test process (tests/threaded_run.py: the same shards and loop, without 3-4 processes' start-up each)
(the momentum runs with a straggler, whose delay the others record as wait). DDP's comm hooks train (fp16 near dense,
PowerSGD's loss falls), and the settings that a mode cannot use are refused."""
from __future__ import annotations

import csv
import json
import statistics

import pytest
import torch

from psrv.experiments.launcher.launch import run_local
from psrv.config import ConfigError, RunConfig, from_dict
from psrv.workers.jobs import load_job
from tests.threaded_run import run_in_threads

pytestmark = pytest.mark.timeout(300)

MOMENTUM = {"plain": 0.0, "momentum": 0.9}
MODES = ("sync", "ddp", "fsdp", "zero1")
ALLREDUCE = ("ddp", "fsdp", "zero1")


def _config(mode: str, momentum: float, **more) -> RunConfig:
    data = {"mode": mode, "cluster": {"workers": 2, "servers": 2 if momentum else 1},
            "job": {"name": "digits_mlp", "steps": 20, "batch_size": 32, "eval_every": 10},
            "optimizer": {"name": "sgd", "lr": 0.1, "momentum": momentum}}
    for key, value in more.items():
        data.setdefault(key, {}).update(value) if isinstance(value, dict) else data.update({key: value})
    return from_dict(RunConfig, data)


def _case(mode: str, case: str) -> RunConfig:
    """The momentum case also has a straggler (sleeps change no math): rank 1 takes 3x, plus 10 ms
    emulated, per step; FSDP's run times the wait with the barrier, the others find it after the run."""
    if case == "plain":
        return _config(mode, MOMENTUM[case])
    barrier = {"allreduce": {"wait_barrier": True}} if mode == "fsdp" else {}
    return _config(mode, MOMENTUM[case], faults={"compute_ms": 10.0, "straggler": "1:3"}, **barrier)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(case, mode) -> (run directory, summary): each all-reduce run on the real launch path; sync PS's
    in threads (its directory holds model.pt and params.pt, as psrv run's would; no summary)."""
    # stays slow: each all-reduce baseline is a gloo process group, one process per rank
    root = tmp_path_factory.mktemp("equivalence")
    done = {}
    for case in MOMENTUM:
        for mode in MODES:
            out = root / case / mode
            if mode == "sync":
                out.mkdir(parents=True)
                run_in_threads(_case(mode, case), out, timeout=120)
                done[case, mode] = out, None
            else:
                done[case, mode] = out, run_local(_case(mode, case), out=out, progress=False, timeout=120)
    return done


@pytest.mark.parametrize("case", MOMENTUM)
@pytest.mark.parametrize("mode", ALLREDUCE)
def test_allreduce_baselines_end_where_sync_ps_ends(runs, case, mode):
    ps, ours = (torch.load(runs[case, m][0] / "model.pt") for m in ("sync", mode))
    initial = load_job("digits_mlp", seed=0).model.state_dict()
    assert list(ours) == list(ps)
    assert max((ours[k] - initial[k]).abs().max() for k in ours) > 1e-2  # training really moved them
    for name in ps:
        torch.testing.assert_close(ours[name], ps[name], rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}")
    flat = torch.load(runs[case, mode][0] / "params.pt")
    assert torch.equal(flat, torch.cat([v.reshape(-1) for v in ours.values()]))


@pytest.mark.parametrize("mode", ALLREDUCE)
def test_allreduce_records_are_the_ddp_baselines(runs, mode):
    out, summary = runs["plain", mode]
    assert summary["mode"] == mode and summary["num_servers"] == 0 and summary["transport"] == "gloo"
    # Counted by each rank: gradient collectives at the steps' ends (2 ranks x 20), optimizer steps that ran.
    assert summary["pushes"] == 40 and summary["updates_applied"] == 20
    assert (summary["max_staleness"], summary["mean_staleness"], summary["max_clock_gap"]) == (None,) * 3
    assert summary["final_loss"] < summary["initial_loss"]
    for rank in (0, 1):
        record = json.loads((out / f"worker-{rank}.json").read_text())
        rows = record["step_log"]
        assert [r["step"] for r in rows] == list(range(20)) and record["mode"] == mode
        assert all(r["compute_seconds"] > 0 and r["communication_seconds"] >= 0 and r["wait_seconds"] >= 0
                   for r in rows)
        assert (record["pushes"], record["updates_applied"]) == (20, 20)
        # evaluations (at 0, 10, 20) are a pause of every rank, outside the rows and train_seconds
        assert record["eval_seconds"] > 0
        assert record["train_seconds"] < rows[-1]["wall_time"] - rows[0]["wall_time"] + 1.0
    with open(out / "steps.csv") as f:
        assert [r["staleness"] for r in csv.DictReader(f)] == [""] * 40
    evals = (out / "evals.csv").read_text().splitlines()
    assert [line.split(",")[1] for line in evals[1:]] == ["0", "10", "20"]


def test_comm_hooks_train(runs, tmp_path):
    """fp16 rounds the all-reduced gradients: near dense DDP, not equal to it; PowerSGD (rank 1, from
    step 2) compresses them: its loss falls and it ends elsewhere than dense."""
    dense = torch.load(runs["plain", "ddp"][0] / "params.pt")
    got = {}
    for hook in ("fp16", "powersgd"):
        cfg = _config("ddp", 0.0, allreduce={"ddp_comm_hook": hook})
        got[hook] = run_local(cfg, out=tmp_path / hook, progress=False, timeout=120)
        assert json.loads((tmp_path / hook / "worker-0.json").read_text())["ddp_comm_hook"] == hook
    fp16 = torch.load(tmp_path / "fp16" / "params.pt")
    assert 0 < (fp16 - dense).abs().max() < 1e-2
    assert got["powersgd"]["final_loss"] < got["powersgd"]["initial_loss"] - 0.05
    assert (torch.load(tmp_path / "powersgd" / "params.pt") - dense).abs().max() > (fp16 - dense).abs().max()


@pytest.mark.parametrize("mode", ALLREDUCE)
def test_a_stragglers_delay_is_the_others_wait(runs, mode):
    """Rank 0 waits for the straggler, rank 1, and that time is wait_seconds, not communication, whether
    found after the run (ddp, zero1) or timed in a barrier (fsdp's run)."""
    out, _ = runs["momentum", mode]
    fast, slow = ([r for r in json.loads((out / f"worker-{rank}.json").read_text())["step_log"] if r["step"]]
                  for rank in (0, 1))  # step 0: lazy set-up
    wait = statistics.median(r["wait_seconds"] for r in fast)
    # the delay is 20 ms a step; counted as communication instead, wait would be about 0 and communication above
    # it (a factor of 3 over the all-reduce's own time failed once under CI's load: 22 ms against 3 x 8 ms)
    assert wait > 0.015 and wait > statistics.median(r["communication_seconds"] for r in fast)
    assert statistics.median(r["wait_seconds"] for r in slow) < wait / 3  # the straggler itself barely waits


@pytest.mark.parametrize(("data", "key"), [
    ({"mode": "fsdp", "allreduce": {"ddp_comm_hook": "fp16"}}, "allreduce.ddp_comm_hook"),
    ({"mode": "sync", "allreduce": {"ddp_comm_hook": "powersgd"}}, "allreduce.ddp_comm_hook"),
    ({"mode": "ddp", "worker": {"local_steps": 4}, "allreduce": {"ddp_comm_hook": "fp16"}}, "allreduce.ddp_comm_hook"),
    ({"mode": "zero1", "worker": {"local_steps": 4}}, "worker.local_steps"),
    ({"mode": "fsdp", "worker": {"local_steps": 4}}, "worker.local_steps"),
    ({"mode": "ddp", "allreduce": {"powersgd_rank": 2}}, "allreduce.powersgd_rank"),
    ({"mode": "async", "allreduce": {"wait_barrier": True}}, "allreduce.wait_barrier"),
])
def test_settings_a_mode_cannot_use_are_refused(data, key):
    with pytest.raises(ConfigError) as err:
        from_dict(RunConfig, data)
    assert err.value.key == key and "\n" not in str(err.value)


def test_the_reports_optimizer_line_names_the_comm_hook():
    from psrv.experiments.harness.report_configs import _optimizer
    hooked = from_dict(RunConfig, {"mode": "zero1", "allreduce": {"ddp_comm_hook": "powersgd", "powersgd_rank": 2}})
    assert "DDP comm hook powersgd rank 2" in _optimizer(hooked)
    assert "comm hook" not in _optimizer(from_dict(RunConfig, {"mode": "ddp"}))
