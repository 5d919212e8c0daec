"""An interrupted run is summarised from the records there are, marked incomplete; a finished run
with a record missing is still an error. And SIGTERM becomes Ctrl-C only where an entry point asks."""
import csv
import json
import os
import signal

import pytest

from psrv.experiments.launcher.summary import build_summary, write_tables
from psrv.config import RunConfig
from psrv.process import Interrupted, exit_code, interrupt_on_signals


def _record(rank: int, steps: int, **extra) -> dict:
    rows = [{"wall_time": 100.0 + s, "worker": rank, "step": s, "loss": 1.0, "staleness": 0,
             "compute_seconds": 0.5, "communication_seconds": 0.1, "wait_seconds": 0.0, "batch_size": 8}
            for s in range(steps)]
    return {"rank": rank, "step_log": rows, "samples": 8 * steps, "pushes": steps, "parameters": 10,
            "evals": [{"wall_time": 99.0, "step": 0, "eval_loss": 2.0, "eval_accuracy": 0.1}], **extra}


def test_a_missing_record_fails_a_finished_run_and_not_an_interrupted_one(tmp_path):
    cfg = RunConfig()                                   # 2 workers
    (tmp_path / "worker-1.json").write_text(json.dumps(_record(1, 5, interrupted=True, steps_done=5)))
    with pytest.raises(RuntimeError, match="expected 2 worker records"):
        build_summary(cfg, tmp_path)
    s = build_summary(cfg, tmp_path, interrupted=True)
    assert (s["complete"], s["interrupted"], s["steps_done"], s["pushes"]) == (False, True, 5, 5)
    assert s["initial_loss"] is None and s["updates_applied"] == 0   # no rank 0, no server: not measured
    write_tables(tmp_path, interrupted=True)
    with open(tmp_path / "steps.csv") as f:
        assert [r["step"] for r in csv.DictReader(f)] == ["0", "1", "2", "3", "4"]
    with open(tmp_path / "evals.csv") as f:
        assert list(csv.DictReader(f)) == []             # evals are rank 0's, and it left none


def test_a_finished_run_is_complete(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"worker-{rank}.json").write_text(json.dumps(_record(rank, 3)))
    s = build_summary(RunConfig(), tmp_path)
    assert s["complete"] is True and "interrupted" not in s and "steps_done" not in s


@pytest.mark.parametrize("mode,paused", [("sync", 2.0), ("ddp", 2.0), ("async", 0.0)])
def test_rank_0s_evaluations_are_off_the_throughput_where_everyone_waits_for_them(mode, paused, tmp_path):
    # two workers, 5 steps of 8 samples each: the first starts at 99.4 (0.6 s before its row at 100), the
    # last ends at 104; rank 0 evaluated for 2 s in between
    (tmp_path / "worker-0.json").write_text(json.dumps(_record(0, 5, eval_seconds=2.0)))
    (tmp_path / "worker-1.json").write_text(json.dumps(_record(1, 5, eval_seconds=0.0)))
    s = build_summary(RunConfig(mode=mode), tmp_path)
    assert s["wall_seconds"] == pytest.approx(4.6) and s["eval_seconds"] == paused
    assert s["samples_per_second"] == pytest.approx(80 / (4.6 - paused))


def test_an_unreadable_record_is_skipped_only_when_interrupted(tmp_path):
    (tmp_path / "worker-0.json").write_text(json.dumps(_record(0, 2)))
    (tmp_path / "worker-1.json").write_text("{")
    with pytest.raises(ValueError):
        build_summary(RunConfig(), tmp_path)
    assert build_summary(RunConfig(), tmp_path, interrupted=True)["steps_done"] == 2


def test_sigterm_raises_as_ctrl_c_once_the_entry_point_asks():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    restore = interrupt_on_signals(grace=60.0)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            os.kill(os.getpid(), signal.SIGTERM)         # the handler runs at the next bytecode
        assert isinstance(caught.value, Interrupted) and exit_code(caught.value) == 143
        os.kill(os.getpid(), signal.SIGINT)              # a second one within the grace: ignored
    finally:
        restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert exit_code(KeyboardInterrupt()) == 130
