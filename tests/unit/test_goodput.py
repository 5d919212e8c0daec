"""Goodput (experiments/launcher/goodput, docs/reliability.md "Goodput"): each step's fate from a small written history (useful,
lost and why, applied twice, redone by a restarted life), the span and its rate, what each fault's window cost
against the baseline's rate, the faults taken from a summary, a baseline that differs or is no run, and the lines
psrv run prints."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.goodput import Measured, RunSteps, Step, baseline, fault_costs, faults_done, goodput, measure
from psrv.experiments.launcher.goodput.steps import read_steps
from psrv.experiments.launcher.summary import format_summary


class Files:
    """DIR/config.json and DIR/history/NAME.PID.jsonl, each event at the time given."""

    def __init__(self, tmp: Path, config: dict):
        self.dir, self.history = tmp, tmp / "history"
        self.history.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(config))
        self.pid = 100

    def life(self, name: str, t: float, **start) -> Path:
        self.pid += 1
        path = self.history / f"{name}.{self.pid}.jsonl"
        self.add(path, t, "start", pid=self.pid, wall=0.0, **start)
        return path

    def add(self, path: Path, t: float, ev: str, **fields) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"ev": ev, "t": t, **fields}) + "\n")


def _written(tmp: Path) -> Files:
    """Two shards, rank 0 and two lives of rank 1: seven steps, each with another fate."""
    h = Files(tmp, {"mode": "async", "cluster": {"workers": 2, "servers": 2}, "job": {"batch_size": 8}})
    a = h.life("worker-1", 0.0, role="worker", w=1)
    b = h.life("worker-1", 5.0, role="worker", w=1)  # rank 1's restarted life
    w0 = h.life("worker-0", 0.0, role="worker", w=0)
    shards = [h.life(f"shard-{k}", 0.0, role="primary", shard=k, address=f"tcp://h:{k}") for k in (0, 1)]
    for s in shards:
        h.add(s, 0.0, "epoch", epoch=0, role="primary")

    def push(w, life, seq, clock, t, acks=(0, 1), dropped=None):
        for k in (0, 1):
            h.add(life, t, "push", w=w, seq=seq, shard=k, clock=clock, to="x")
        for k in acks:
            h.add(life, t + 0.1, "ack", w=w, seq=seq, shard=k, epoch=0, version=0, dropped=dropped if k == 0 else None)

    def apply(k, w, seq, t):
        h.add(shards[k], t, "apply", w=w, seq=seq, clock=0, version=0, epoch=0)

    push(1, a, 1, 0, 1.0)
    push(1, a, 2, 1, 2.0)
    push(1, a, 3, 2, 3.0, acks=(0,))  # the life died before shard 1 answered, nor did shard 1 apply it
    push(1, a, 4, 3, 4.0, dropped="late")  # shard 0 dropped it
    push(0, w0, 5, 0, 1.5)  # applied twice on shard 0
    push(0, w0, 6, 1, 2.5)  # acknowledged by both, missing on shard 1: what the checker's rule 1 catches
    push(1, b, 10, 1, 6.0)  # the restarted life does clock 1 again, which life a's seq 2 applied
    for k, w, seq, t in [(0, 1, 1, 1.05), (1, 1, 1, 1.06), (0, 1, 2, 2.05), (1, 1, 2, 2.06), (0, 1, 3, 3.05),
                         (0, 0, 5, 1.55), (0, 0, 5, 1.56), (1, 0, 5, 1.57), (0, 0, 6, 2.55), (1, 1, 4, 4.05),
                         (0, 1, 10, 6.05), (1, 1, 10, 6.07)]:
        apply(k, w, seq, t)
    h.add(shards[0], 4.05, "drop", w=1, seq=4, clock=3, why="late", epoch=0)
    for s in shards:
        h.add(s, 7.0, "member", w=0, what="finish", epoch=0)
        h.add(s, 8.0, "member", w=1, what="leave", epoch=0)
    return h


def test_each_step_is_useful_lost_twice_or_redone_as_the_histories_say(tmp_path):
    steps = read_steps(_written(tmp_path).dir, servers=2)
    fate = {key: (s.useful, s.loss(), s.twice) for key, s in steps.steps.items()}
    assert fate == {(1, 1): (True, None, False), (1, 2): (True, None, False),
                    (1, 3): (False, "unacknowledged", False), (1, 4): (False, "dropped", False),
                    (0, 5): (True, None, True), (0, 6): (False, "acknowledged", False),
                    (1, 10): (True, None, False)}
    assert [(s.w, s.seq) for s in steps.redone()] == [(1, 10)]
    assert steps.started == 1.0 and steps.finished == {0: 7.0, 1: 8.0}
    assert steps.steps[(1, 10)].done_t == 6.07  # the last shard's apply


def test_the_block_counts_steps_and_samples_and_rates_the_span_to_the_first_rank_done(tmp_path):
    h = _written(tmp_path)
    cfg = from_dict(RunConfig, json.loads((h.dir / "config.json").read_text()))
    block = goodput(h.dir, cfg, [], None)
    assert block["steps"] == {"pushed": 7, "useful": 4, "lost": 3, "twice": 2}
    assert block["samples"] == {"useful": 32, "lost": 24, "twice": 16}
    assert block["lost"] == {"unacknowledged": 1, "dropped": 1, "acknowledged": 1}
    assert block["twice"] == {"applied_twice": 1, "redone": 1}
    # the span: the first push (1.0) to rank 0's finish (7.0), every useful step inside it
    assert block["span_s"] == 6.0 and block["samples_per_second"] == pytest.approx(32 / 6.0, abs=1e-3)
    assert block["goodput"] is None and block["fault_cost_s"] is None  # no baseline: no ratio, no costs
    assert block["end_to_end"]["samples_per_second"] == pytest.approx(32 / 5.07, abs=1e-3)


def _measured() -> Measured:
    """10 samples a step; a step every 0.1 s but none from 4.0 to 6.0; the span 0 to 10, then a tail to 12."""
    done = [round(0.1 * i, 3) for i in range(1, 41)] + [round(0.1 * i, 3) for i in range(61, 101)] + [10.5, 11.0, 12.0]
    return Measured(start=0.0, end=10.0, last=12.0, per_step=10, done=done)


def test_a_fault_costs_its_window_less_what_the_baseline_needs_for_the_samples_made_in_it():
    m = _measured()
    faults = [{"id": 2, "kind": "kill", "target": "worker:3", "t": 7.0},
              {"id": 1, "kind": "pause", "target": "primary:0", "t": 4.0},
              {"id": 3, "kind": "kill", "target": "backup:1", "t": 11.0}]  # after the span: in the tail
    rows, before = fault_costs(m, faults, base_rate=100.0)
    assert [(r["id"], r["window_s"], r["samples"], r["cost_s"]) for r in rows] == [
        (1, 3.0, 100, 2.0),     # 4.0-7.0: 3 s for 10 steps the baseline makes in 1 s
        (2, 3.0, 310, -0.1),    # 7.0-10.0: faster than the baseline, said as it is
        (3, 0.0, 0, None)]
    assert before == pytest.approx(0.1)  # 0-4.0: 39 steps
    # the costs add up to the span less the baseline's time for every useful sample in it: 10 - 800 / 100
    assert before + sum(r["cost_s"] for r in rows if r["cost_s"] is not None) == pytest.approx(2.0)
    assert m.rate == pytest.approx(80.0) and m.whole_rate == pytest.approx(830 / 12.0)
    assert fault_costs(m, faults, base_rate=None)[0][0]["cost_s"] is None


def test_the_span_ends_at_the_first_rank_done_or_else_at_the_last_useful_step():
    def step(seq, t):
        s = Step(1, seq, "worker-1.1.jsonl", 1, clock={0: seq}, applied={0: 1})
        s.done_t = t
        return s
    steps = {(1, i): step(i, float(i)) for i in range(1, 6)}
    m = measure(RunSteps(steps, {1: ["worker-1.1.jsonl"]}, started=0.5, finished={1: 3.5, 2: 4.5}), per_step=4)
    assert (m.start, m.end, m.last, m.samples(m.start, m.end)) == (0.5, 3.5, 5.0, 12)
    assert measure(RunSteps(steps, {}, started=0.5, finished={}), per_step=4).end == 5.0
    assert measure(RunSteps({}, {}, started=None, finished={}), per_step=4) is None


def test_the_faults_are_the_nemesiss_done_and_the_kills_on_the_launchers_clock():
    faults = {"kills": [{"process": "server-1", "killed": True, "wall_s": 3.0},
                        {"process": "worker-2", "killed": False, "step": 10}],
              "nemesis": {"faults": [{"id": 1, "kind": "pause", "target": "worker:1", "t": 50.0, "done": True},
                                     {"id": 2, "kind": "kill", "target": "backup:0", "t": 51.0, "done": False}]}}
    assert faults_done(faults, started=40.0) == [
        {"id": 1, "kind": "pause", "target": "worker:1", "t": 50.0},
        {"id": "kill-1", "kind": "kill", "target": "primary:1", "t": 43.0}]


def test_a_baseline_is_measured_alike_and_says_where_it_differs(tmp_path):
    h = _written(tmp_path / "base")
    run = from_dict(RunConfig, {"mode": "async", "cluster": {"workers": 3, "servers": 2},
                                "job": {"batch_size": 8, "steps": 5000}, "nemesis": {"schedule": "kill worker:1 at 3s"}})
    block = baseline(h.dir, run)
    assert block["samples_per_second"] == pytest.approx(32 / 6.0, abs=1e-3)
    assert block["differs"] == ["cluster.workers: 2 vs 3"]  # not its steps, not the nemesis
    (tmp_path / "none").mkdir()
    with pytest.raises(ValueError, match="--goodput-baseline .*none: .*config.json"):
        baseline(tmp_path / "none", run)


def test_psrv_run_prints_goodput_the_losses_the_costs_and_the_check():
    block = {"baseline": {"run": "runs/base", "samples_per_second": 1000.0}, "samples_per_second": 900.0,
             "goodput": 0.9, "end_to_end": {"goodput": 0.85}, "span_s": 100.0, "samples": {"lost": 64, "twice": 0},
             "steps": {"lost": 2}, "lost": {"unacknowledged": 2, "dropped": 0, "acknowledged": 0},
             "twice": {"applied_twice": 0, "redone": 0}, "fault_cost_s": 10.0,
             "by_kind": {"kill": {"mean_s": 2.5}, "pause": {"mean_s": None}}}
    lines = dict(line.split("  ", 1) for line in format_summary(
        {"mode": "async", "goodput": block, "history_check": {"ok": True, "violations": []}}).splitlines())
    assert lines["goodput"].strip() == "0.900: 900 useful samples/s against 1000 (runs/base); end to end 0.850"
    assert lines["samples lost"].strip() == "64 (2 steps: 2 unacknowledged, 0 dropped, 0 acknowledged)"
    assert lines["fault cost"].strip() == "10.0 s of 100.0 s; mean per fault: kill 2.50 s"
    assert lines["history check"].strip() == "clean"


def test_make_chaos_draws_every_kind_on_every_target_and_reports_a_failed_run():
    from psrv.config.nemesis import parse_schedule
    from psrv.experiments.bench.chaos import _row, report, schedule
    text = schedule(every=7, duration=2, kinds=("kill", "pause", "late_ack"), seed=3)
    clause, = parse_schedule(text)
    assert (clause.every, clause.law, clause.kinds) == (7.0, "fixed", ("kill", "pause", "late_ack"))
    assert [str(t) for t in clause.targets] == ["primary:*", "backup:*", "worker:*", "launcher"]
    summary = {"mode": "async", "job": "digits_mlp", "wall_seconds": None, "final_loss": None,
               "faults": {"nemesis": {"done": 2, "not_done": 1, "by_kind": {"kill": {"done": 2, "not_done": 1}},
                                      "by_target": {"worker:*": {"done": 2, "not_done": 1}}}},
               "history_check": {"ok": True, "violations": []},
               "goodput": {"goodput": 0.8, "samples_per_second": 80.0, "baseline": {"samples_per_second": 100.0},
                           "end_to_end": {"goodput": 0.7}, "samples": {"lost": 0, "twice": 0}, "lost": {},
                           "fault_cost_s": 2.0, "span_s": 10.0, "before_faults_s": 0.0,
                           "by_kind_target": {"kill worker": {"faults": 2, "costed": 2, "mean_s": 1.0, "cost_s": 2.0}}}}
    row = _row(summary, schedule=text, minutes=1, partition="drawn", failed="worker-0 exited with code 1",
               workers=8, servers=2, replicas=2, compute_ms=100.0, seed=3)
    assert (row["violations"], row["goodput"], row["ratio"], row["faults"]) == (0, 0.8, 0.8, 2)
    shown = report(row)
    assert "FAILED: worker-0 exited with code 1" in shown and "history check   clean" in shown
    assert "kill worker" in shown and "mean 1.0 s over the 2 costed" in shown
