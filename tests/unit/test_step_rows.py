"""Every step row says whether it pushed: the shipped loop's, a psrv.Worker script's (psrv/client/steplog.py),
and steps.csv's `pushed` column from them, so what reads the rows counts pushes, not inner steps."""
import csv
import json

import pytest
import torch

from psrv.experiments.launcher.summary import write_tables
from psrv.client.steplog import ROW, RecordFiles, StepLog


def _log(tmp_path) -> StepLog:
    log = StepLog(RecordFiles(record=tmp_path / "worker-0.json", params=tmp_path / "params.pt",
                              progress=tmp_path / "worker-0.progress"))
    log.describe(rank=0, world_size=1, parameters=3, plan_hash="h", wire_dtype="float32", overlap=False)
    return log


def _push(log: StepLog, step: int, pushed: bool, batch_size: int | None = 4) -> None:
    log.row(step=step, loss=torch.tensor(1.0), compute_seconds=0.01, communication_seconds=0.0,
            wait_seconds=0.0, batch_size=batch_size, staleness=step % 2, pushed=pushed)


def test_a_scripts_step_log_says_pushed_on_every_row(tmp_path):
    log = _log(tmp_path)
    for step, pushed in enumerate((False, False, True, False, False, True)):  # local steps, H = 3
        _push(log, step, pushed)
    assert [row.get("pushed") for row in log.rows] == [False, False, True, False, False, True]
    assert [tuple(row) for row in log.rows] == [tuple(ROW)] * 6  # every column, in the declared order


def test_the_record_counts_what_the_rows_hold_and_the_files_get_it(tmp_path):
    log = _log(tmp_path)
    for step in range(12):
        _push(log, step, True, batch_size=4 if step else 3)
    record = log.record(early_sends=5)
    assert (record["steps"], record["pushes"], record["samples"], record["max_staleness"]) == (12, 12, 47, 1)
    assert record["batch_size"] is None and record["early_sends"] == 5  # the steps' sizes differ
    log.save(record, params=torch.arange(3.0))
    assert json.loads((tmp_path / "worker-0.json").read_text())["step_log"] == log.rows
    assert torch.equal(torch.load(tmp_path / "params.pt"), torch.arange(3.0))
    assert (tmp_path / "worker-0.progress").read_text() == "12"


def test_a_step_without_a_batch_size_leaves_samples_unknown_and_an_interrupt_keeps_no_weights(tmp_path):
    log = _log(tmp_path)
    _push(log, 0, True)
    _push(log, 1, True, batch_size=None)
    record = log.record(interrupted=True)
    assert record["samples"] is None and (record["interrupted"], record["steps_done"]) == (True, 2)
    log.save(record, params=torch.zeros(3))
    assert not (tmp_path / "params.pt").exists() and (tmp_path / "worker-0.json").exists()


def test_a_key_the_schema_does_not_declare_is_refused(tmp_path):
    log = _log(tmp_path)
    with pytest.raises(ValueError, match="not declared.*loss_scale"):
        log.describe(loss_scale=1.0)
    with pytest.raises(ValueError, match="not declared.*lr"):
        log.row(step=0, loss=None, compute_seconds=0.0, communication_seconds=0.0, wait_seconds=0.0,
                batch_size=None, lr=0.1)
    with pytest.raises(ValueError, match="not declared.*tokens"):
        log.record(tokens=3)


def test_steps_csv_has_the_pushed_column_on_every_row(tmp_path):
    rows = [{"wall_time": 100.0 + s, "worker": 0, "step": s, "loss": 1.0, "staleness": s % 2,
             "compute_seconds": 0.1, "communication_seconds": 0.0, "wait_seconds": 0.0, "batch_size": 8,
             "pushed": s % 2 == 1} for s in range(4)]
    (tmp_path / "worker-0.json").write_text(json.dumps({"rank": 0, "step_log": rows, "evals": []}))
    ddp = [{**{k: v for k, v in r.items() if k not in ("staleness", "pushed")}, "worker": 1}
           for r in rows]  # all-reduce's rows: no staleness, no push
    (tmp_path / "worker-1.json").write_text(json.dumps({"rank": 1, "step_log": ddp, "evals": []}))
    write_tables(tmp_path)
    with open(tmp_path / "steps.csv") as f:
        written = list(csv.DictReader(f))
    assert [(r["worker"], r.get("pushed")) for r in written if r["worker"] == "0"] == \
        [("0", "False"), ("0", "True"), ("0", "False"), ("0", "True")]
    assert {r.get("pushed") for r in written if r["worker"] == "1"} == {""}  # no push to speak of, as staleness
