"""Every step row says whether it pushed: the shipped loop's, a psrv.Worker script's (psrv/worker/steplog.py),
and steps.csv's `pushed` column from them, so what reads the rows counts pushes, not inner steps."""
import csv
import json

import torch

from psrv.experiments.summary import write_tables
from psrv.worker.steplog import StepLog
from psrv.worker import StepInfo


def _log(tmp_path) -> StepLog:
    return StepLog(tmp_path / "worker-0.json", rank=0, world_size=1, params=torch.zeros(3), plan_hash="h",
                   wire_dtype="float32", overlap=False)


def test_a_scripts_step_log_says_pushed_on_every_row(tmp_path):
    log = _log(tmp_path)
    for step, pushed in enumerate((False, False, True, False, False, True)):  # local steps, H = 3
        info = StepInfo(step=step, clock=step // 3, version=0, staleness=0, waited=0.0, seconds=0.01, pushed=pushed)
        log.step(info, loss=1.0, batch_size=4, started=0.0)
    assert [row.get("pushed") for row in log.rows] == [False, False, True, False, False, True]


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
