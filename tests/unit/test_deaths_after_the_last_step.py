"""A worker that dies after its last step (its record written whole) lost nothing (experiments/launcher/deaths.py):
the run goes on, restarts on or off, in sync without backup workers too; the death is recorded `finished`, with
none of its steps counted as not done, and its cause is the fault that killed that life (a restarted rank's lives
share a name). Without a whole record (SIGKILLed mid-run, or interrupted) nothing changes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.deaths import Deaths


class Proc:
    def __init__(self, pid: int, returncode: int | None):
        self.pid, self.returncode = pid, returncode

    def poll(self):
        return self.returncode


class Cluster:
    def __init__(self, procs: dict):
        self.procs, self.spared = procs, set()


def deaths(tmp_path: Path, *, restarted=frozenset(), **tree) -> tuple[Deaths, list]:
    cfg = from_dict(RunConfig, {"mode": "sync", "cluster": {"workers": 3}, "job": {"steps": 100},
                                "worker": {"local_steps": 20}, **tree})
    asked = []

    def said(name: str, pid: int) -> str:
        asked.append((name, pid))
        return f"was killed by the nemesis (the fault of pid {pid})"
    return Deaths(cfg, tmp_path, 0.0, script=False, steps=100, said=said, restarted=lambda: set(restarted)), asked


def never(cluster, name):  # the inner recover: nothing restarts, nothing else spares it
    return False


@pytest.mark.parametrize("restarted", [frozenset(), frozenset({2})])
def test_a_worker_killed_after_writing_its_whole_record_costs_nothing(tmp_path, restarted):
    (tmp_path / "worker-2.json").write_text(json.dumps({"rank": 2, "steps": 40, "step_log": []}))
    (tmp_path / "worker-2.progress").write_text("40")
    d, asked = deaths(tmp_path, restarted=restarted)
    cluster = Cluster({"worker-2": Proc(4242, -9), "worker-0": Proc(1, None)})
    assert d.recover_or(never)(cluster, "worker-2") is True
    assert "worker-2" in cluster.spared and asked == [("worker-2", 4242)]
    [entry] = d.done
    assert entry["finished"] and entry["survived"] and entry["steps_not_done"] == 0
    assert entry["cause"] == "was killed by the nemesis (the fault of pid 4242)"
    assert d.ranks == set()  # it wrote its record: not one of the ranks that write none


@pytest.mark.parametrize("record", [None, {"rank": 2, "interrupted": True, "steps_done": 30},
                                    {"rank": 2, "failed": "boom", "steps_done": 30}, "not json"])
def test_without_a_whole_record_the_death_of_a_sync_worker_ends_the_run(tmp_path, record):
    if record is not None:
        (tmp_path / "worker-2.json").write_text(record if isinstance(record, str) else json.dumps(record))
    d, _ = deaths(tmp_path)
    cluster = Cluster({"worker-2": Proc(4242, -9), "worker-0": Proc(1, None)})
    assert d.recover_or(never)(cluster, "worker-2") is False
    assert not cluster.spared and not d.done[0]["survived"] and "finished" not in d.done[0]


def test_a_restarted_lifes_steps_not_done_count_from_its_last_acknowledged_clock(tmp_path):
    """Rank 2's second life began at step 620 and did 300 steps; its last push shard 0 acknowledged was clock 45
    (steps 900-919): 80 of the rank's 1000 steps are not done, not 1000 - 300."""
    from psrv.history import History
    (tmp_path / "history").mkdir()
    h = History(tmp_path / "history" / "worker-2.4242.jsonl")  # as the worker's life writes it
    h.start("worker", w=2)
    for seq, clock in ((1, 44), (2, 45)):
        h.record("push", w=2, seq=seq, shard=0, clock=clock, to="tcp://127.0.0.1:1")
        h.record("ack", w=2, seq=seq, shard=0, epoch=0, version=clock, dropped=None, **{"from": "tcp://127.0.0.1:1"})
    h.record("push", w=2, seq=3, shard=0, clock=46, to="tcp://127.0.0.1:1")  # sent, never acknowledged
    h.close()
    (tmp_path / "worker-2.progress").write_text("300")
    d, _ = deaths(tmp_path, job={"steps": 1000})
    d.steps = 1000
    cluster = Cluster({"worker-2": Proc(4242, -9), "worker-0": Proc(1, None)})
    d.recover_or(never)(cluster, "worker-2")
    assert (d.done[0]["rank_steps"], d.done[0]["last_clock"], d.done[0]["steps_not_done"]) == (300, 45, 1000 - 920)
