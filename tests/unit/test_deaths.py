"""experiments/launcher/deaths.py's rule of which worker deaths a run goes on without, a failed run's summary (marked
incomplete with its cause, from the records there are), and the `died` line psrv run prints."""
from __future__ import annotations

import json

import pytest

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.deaths import survives_workers
from psrv.experiments.launcher.summary import build_summary, format_summary
from tests.unit.test_interrupted_summary import _record


@pytest.mark.parametrize("mode,backup_workers,script,survives", [
    ("async", 0, False, True), ("ssp", 0, False, True), ("sync", 1, False, True),
    ("sync", 0, False, False),   # every rank's gradient in every clock: a death ends it
    ("async", 0, True, False),   # a script's run needs every rank's record
    ("ddp", 0, False, False),    # the all-reduce group cannot go on without a rank
])
def test_which_worker_deaths_a_run_goes_on_without(mode, backup_workers, script, survives):
    cfg = from_dict(RunConfig, {"mode": mode, "backup_workers": backup_workers, "cluster": {"workers": 3}})
    assert survives_workers(cfg, script=script) is survives


def test_a_failed_run_is_summarised_from_the_records_there_are_with_its_cause(tmp_path):
    (tmp_path / "worker-0.json").write_text(json.dumps(_record(0, 4, interrupted=True, steps_done=4)))
    s = build_summary(RunConfig(), tmp_path, failed="worker-1 was killed by signal 9; its output: DIR/worker-1.log")
    assert (s["complete"], s["interrupted"], s["steps_done"]) == (False, False, 4)
    assert s["cause"] == "worker-1 was killed by signal 9; its output: DIR/worker-1.log"
    assert format_summary(s).splitlines()[0].split(None, 1) == ["incomplete", s["cause"]]


def test_every_death_is_one_line_of_the_table():
    faults = {"kills": [], "restarts": [], "lost_clocks": {},
              "dead_replicas": [{"process": "backup-0-1", "cause": "was killed by signal 9", "before_workers": True},
                                {"process": "server-0", "cause": "was killed by signal 9", "step": 30,
                                 "replaced_by": "backup-0-3"}],
              "deaths": [{"process": "worker-2", "cause": "was killed by signal 9", "step": 50, "steps_not_done": 70,
                          "survived": True},
                         {"process": "worker-1", "cause": "exited with code 1", "step": 60, "steps_not_done": None,
                          "survived": False}]}
    lines = dict(line.split(None, 1) for line in format_summary({"mode": "async", "faults": faults}).splitlines())
    assert lines["died"] == ("backup-0-1 was killed by signal 9 before the workers started; server-0 was killed by signal 9 at worker 0's step 30, replaced by backup-0-3; "
                             "worker-2 was killed by signal 9 at worker 0's step 50 (70 of its steps not done); the "
                             "run went on without it; worker-1 exited with code 1 at worker 0's step 60; the run ended")
