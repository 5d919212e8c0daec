"""`psrv run --script FILE.py ARGS`: a user's own loop on psrv.Worker as the workers of the embedded local
cluster. Its steps.csv and summary.json come from psrv.Worker's step log (PSRV_RECORD): the script's
own losses, one row per worker step, the servers' update count, and nothing a script cannot know."""
import csv
import json
from pathlib import Path

import pytest
import torch

from psrv.cli import main
from psrv.client.steplog import check_step_args
from tests.helpers import psrv_argv, psrv_run, run_in_session
from tests.integration import user_loop
from tests.integration.test_worker_api import LR, MOMENTUM, WORKERS, _global_batch_sgd

SCRIPT = Path(__file__).with_name("script_loop.py")  # user_loop's data and model; step(loss=, batch_size=)
STEPS = 12  # of the 20 in an epoch: --steps reaches the script as PSRV_STEPS, and it stops there


def _rows(out: Path) -> list[dict]:
    with open(out / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(180)
def test_a_sync_script_run_is_single_process_sgd_on_the_global_batch_and_logs_the_scripts_losses(tmp_path):
    out, final = tmp_path / "run", tmp_path / "final.pt"
    s = psrv_run(out, "--mode", "sync", "--servers", "2", "--workers", str(WORKERS), "--lr", str(LR),
                 "--momentum", str(MOMENTUM), "--steps", str(STEPS), "--script", str(SCRIPT), "1", str(final))
    servers = [json.loads((out / f"server-{i}.json").read_text()) for i in range(2)]
    assert s["pushes"] == WORKERS * STEPS
    assert s["updates_applied"] == servers[0]["updates_applied"] == STEPS          # sync: one per clock
    assert s["updates_applied_per_shard"] == [srv["updates_applied"] for srv in servers]
    assert (s["job"], s["script_args"], s["steps"], s["batch_size"]) == (str(SCRIPT), ["1", str(final)], STEPS,
                                                                         user_loop.BATCH)
    assert [s[k] for k in ("initial_loss", "final_loss", "eval_accuracy")] == [None] * 3  # not made up
    assert s["seed"] == 0                                                          # handed over as PSRV_SEED
    assert s["samples_per_second"] > 0 and s["max_staleness"] == 0
    rows = _rows(out)
    assert len(rows) == WORKERS * STEPS
    for rank in range(WORKERS):
        mine = sorted((r for r in rows if r["worker"] == str(rank)), key=lambda r: int(r["step"]))
        assert [int(r["step"]) for r in mine] == list(range(STEPS))
        losses = json.loads((tmp_path / f"final.pt.losses-{rank}.json").read_text())  # the script's own
        assert [float(r["loss"]) for r in mine] == losses
        assert {r["batch_size"] for r in mine} == {str(user_loop.BATCH)}
        assert all(float(r["compute_seconds"]) > 0 for r in mine)  # forward and backward, between step() calls
    want = _global_batch_sgd(STEPS)
    initial = torch.cat([p.detach().reshape(-1) for p in user_loop.model().parameters()])
    assert (want - initial).abs().max() > 1e-2                                     # the reference really moved
    torch.testing.assert_close(torch.load(final), want, rtol=0, atol=1e-5)         # the script's own save
    torch.testing.assert_close(torch.load(out / "params.pt"), want, rtol=0, atol=1e-5)  # rank 0's, as a job's


@pytest.mark.timeout(180)
def test_a_loop_that_passes_no_loss_gets_empty_cells_not_invented_ones(tmp_path):
    out = tmp_path / "run"  # user_loop.py as test_worker_api runs it: plain ps.step(); both ranks write its JSON
    s = psrv_run(out, "--mode", "async", "--momentum", "0.5", "--servers", "1", "--workers", str(WORKERS),
                 "--script", user_loop.__file__, "1", str(tmp_path / "ignored.json"))
    steps = user_loop.SAMPLES // WORKERS // user_loop.BATCH
    rows = _rows(out)
    assert s["pushes"] == len(rows) == WORKERS * steps and s["steps"] == steps
    assert s["updates_applied"] == WORKERS * steps                                   # async: one per push
    assert {(r["loss"], r["batch_size"]) for r in rows} == {("", "")}
    assert (s["batch_size"], s["samples_per_second"]) == (None, None)


@pytest.mark.timeout(180)
def test_a_script_that_raises_fails_the_run_in_one_line_naming_the_rank_code_and_log(tmp_path):
    out = tmp_path / "run"
    proc = run_in_session(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--mode", "sync",
                                    "--servers", "1", "--out", str(out), "--script", str(SCRIPT), "1",
                                    str(tmp_path / "final.pt"), "0"), timeout=150)
    assert proc.returncode == 1, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if "psrv run" in line]
    assert lines == [f"psrv run failed: rank 1 ({SCRIPT}) exited with code 1 (RuntimeError: rank 1 fails at "
                     f"step 0, as asked); its output: {out / 'worker-1.log'}"], proc.stdout
    assert "Traceback" in (out / "worker-1.log").read_text()                        # the script's output is there


@pytest.mark.parametrize("args, says", [
    (("--mode", "fsdp"), "--mode fsdp: not with --script: fully_shard would turn the model's parameters into"),
    (("--mode", "ddp", "--ddp-comm-hook", "fp16"), "--ddp-comm-hook: not used with --script (psrv.Worker "
                                                   "all-reduces the plain mean gradient)"),
    (("--job", "mnist1d_mlp"), "--job: not used with --script"),
    (("--compute-ms", "5"), "--compute-ms: not used with --script"),
    (("--batch-size", "8"), "--batch-size: not used with --script (the shipped loop's setting; your script decides "
                            "it); remove it"),
    (("--local-steps", "4", "--inner-optimizer", "sgd"), "--inner-optimizer: not used with --script (the shipped "
                                                          "loop's inner optimizer;"),
    (("--transport", "rpc"), "--transport: --script's workers reach the shards over zmq"),
], ids=["fsdp", "ddp-comm-hook", "job", "faults", "batch-size", "inner-optimizer", "rpc"])
def test_what_a_script_cannot_use_is_refused_in_one_line(args, says, capsys, tmp_path):
    assert main(["run", "--out", str(tmp_path), *args, "--script", str(SCRIPT), "1", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("psrv run: error: ") and says in err, err
    assert not (tmp_path / "config.json").exists()                                   # nothing started


def test_script_and_its_arguments_come_last_and_the_file_must_exist(capsys, tmp_path):
    assert main(["run", "--script", "--workers", "2"]) == 2
    assert "psrv's own options go before --script" in capsys.readouterr().err
    assert main(["run", "--script", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_step_takes_a_number_or_a_one_element_tensor_as_its_loss():
    check_step_args(0.5, 16)
    check_step_args(torch.tensor(0.5), None)
    with pytest.raises(ValueError, match=r"loss=.*shape \(2,\)"):
        check_step_args(torch.ones(2), None)
    with pytest.raises(ValueError, match="batch_size"):
        check_step_args(None, -1)
