"""The history checker (psrv.experiments.launcher.history, docs/history.md) on histories written by hand: clean runs it
must pass, with a failover among them, and one history per way to break a rule, which it must name."""
import json

import pytest

from psrv.experiments.launcher.history import HistoryError, check_run
from tests.history_builder import RunFolder, ssp_case

A, B, C = "tcp://127.0.0.1:5000", "tcp://127.0.0.1:5001", "tcp://127.0.0.1:5002"


def only(result, rule: int, file: str, line: int | None):
    """The result's first violation breaks `rule` at `file`:`line`."""
    assert not result.ok
    first = result.violations[0]
    assert (first.rule, first.file, first.line) == (rule, file, line), str(first)
    return first


def sync_clock(run, workers, primary, clock, seqs, *, backups=(), epoch=0):
    """Every worker pushes `clock` (a PUSH, acknowledged once held), the clock commits, the pulls are answered."""
    for w, seq in zip(workers, seqs):
        run.push(w, seq, clock, to=primary.address)
        for r in (primary, *backups):
            r.apply(w.w, seq, clock, epoch)
        run.ack(w, primary, seq, epoch=epoch)
    for r in (primary, *backups):
        r.commit(clock, [w.w for w in workers], need=len(workers))
    for w, seq in zip(workers, seqs):
        run.answer(w, primary, seq + 1, clock + 1, epoch=epoch)


# --- clean ------------------------------------------------------------------------------------------------

def test_a_clean_sync_run_with_a_failover_passes(tmp_path):
    """Clock 0 on the primary alone; a backup joins from its state; the primary dies mid clock 1 (its last line
    torn); the backup takes over at epoch 1, takes the re-sent push, commits, and a new backup joins it."""
    run = RunFolder(tmp_path, mode="sync")
    w0, w1 = run.worker(0), run.worker(1)
    p = run.replica(0, "primary", A)
    sync_clock(run, [w0, w1], p, 0, (1, 1))
    b = run.replica(0, "backup", B, primary=A)
    run.join(p, b, n=5)
    run.push(w0, 3, 1, to=A)
    p.apply(0, 3, 1)
    b.apply(0, 3, 1)
    run.ack(w0, p, 3)
    run.push(w1, 3, 1, to=A)
    p.append('{"ev": "apply", "w": 1, "seq": 3, "t": 0.0')  # killed while it wrote: torn
    b("epoch", epoch=1, role="primary", primary=B)
    b.apply(1, 3, 1, epoch=1)
    b.commit(1, [0, 1], need=2)
    run.ack(w1, b, 3, epoch=1)
    c = run.replica(0, "backup", C, epoch=1, primary=B)
    run.join(b, c, n=9, epoch=1)
    run.answer(w0, b, 4, 2, epoch=1)
    run.answer(w1, b, 4, 2, epoch=1)
    run.record("server-0", pushes=4, updates_applied=2, version=2)
    run.record("summary", complete=True, pushes=4, updates_applied=2, updates_applied_per_shard=[2])
    result = check_run(tmp_path)
    assert result.ok, result.line()
    counts = result.counts
    assert (counts.acknowledged, counts.applied, counts.replicas, counts.epochs, counts.commits, counts.answered) \
        == (4, 4, 3, 2, 2, 4)
    assert result.skipped == []
    assert "clean (sync, rules 1-5): 4 acknowledged pushes, 4 applied, 3 replicas" in result.line()


def test_a_clean_async_run_on_two_shards_passes(tmp_path):
    run = RunFolder(tmp_path, mode="async", servers=2)
    w0, w1 = run.worker(0), run.worker(1)
    s0, s1 = run.replica(0, "primary", A), run.replica(1, "primary", B)
    for seq, w in ((1, w0), (1, w1), (2, w1), (2, w0), (3, w1)):
        for shard, primary in ((0, s0), (1, s1)):
            run.step(w, primary, seq=seq, clock=seq - 1, shard=shard)
    for k in (0, 1):
        run.record(f"server-{k}", pushes=5, updates_applied=5, version=5)
    run.record("summary", complete=True, pushes=5, updates_applied=5, updates_applied_per_shard=[5, 5])
    result = check_run(tmp_path)
    assert result.ok, result.line()
    assert (result.counts.applied, result.counts.answered, result.counts.commits) == (10, 10, 0)


def test_a_clean_ssp_run_passes_the_bound_counted_over_the_active_workers_only(tmp_path):
    result = check_run(ssp_case(tmp_path, slowest_leaves=True).dir)
    assert result.ok, result.line()
    assert result.skipped == ["server-0.json: none in the run folder", "summary.json: none in the run folder"]


def test_a_torn_last_line_is_skipped(tmp_path):
    run = ssp_case(tmp_path, slowest_leaves=True)
    w = run.worker(1)
    w.append('{"ev": "push", "w": 1, "seq": 7, "sh')
    assert check_run(tmp_path).ok


# --- rule 1 -----------------------------------------------------------------------------------------------

def test_a_lost_write_is_the_workers_acknowledgement_of_a_push_never_applied(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0, p = run.worker(0), run.replica(0, "primary", A)
    run.step(w0, p, seq=1, clock=0)
    run.push(w0, 2, 1)
    line = run.ack(w0, p, 2)  # acknowledged, never applied
    first = only(check_run(tmp_path), 1, w0.file, line)
    assert "push seq 2 to shard 0" in first.message and "never applied it" in first.message


def test_a_write_applied_twice_is_its_second_apply(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0, p = run.worker(0), run.replica(0, "primary", A)
    run.step(w0, p, seq=1, clock=0)
    line = p.apply(0, 1, 0)  # a re-sent push applied again
    assert "a second time" in only(check_run(tmp_path), 1, p.file, line).message


def test_a_write_nobody_sent_is_its_apply(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0, p = run.worker(0), run.replica(0, "primary", A)
    run.step(w0, p, seq=1, clock=0)
    line = p.apply(1, 5, 0)
    assert "no worker recorded sending" in only(check_run(tmp_path), 1, p.file, line).message


# --- rule 2 -----------------------------------------------------------------------------------------------

def test_two_replicas_acknowledging_in_one_epoch_is_a_split_brain(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0, w1 = run.worker(0), run.worker(1)
    p, b = run.replica(0, "primary", A), run.replica(0, "backup", B, primary=A)
    run.step(w0, p, seq=1, clock=0, backups=(b,))
    run.push(w1, 1, 0, to=B)
    b.apply(1, 1, 0)
    p.apply(1, 1, 0)
    run.ack(w1, b, 1)  # the backup answers in epoch 0, its primary's
    line = b.lines  # its `ack`
    first = only(check_run(tmp_path), 2, b.file, line)
    assert "two acknowledgers in one epoch" in first.message


def test_an_old_primary_acknowledging_what_the_new_one_does_not_hold_is_a_split_brain(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0 = run.worker(0)
    p, b = run.replica(0, "primary", A), run.replica(0, "backup", B, primary=A)
    run.step(w0, p, seq=1, clock=0, backups=(b,))
    b("epoch", epoch=1, role="primary", primary=B)  # cut off from its primary, it takes over
    run.push(w0, 2, 1, to=A)
    p.apply(0, 2, 1)  # the old primary goes on alone
    run.ack(w0, p, 2)
    line = p.lines  # its `ack`
    first = only(check_run(tmp_path), 2, p.file, line)
    assert "acknowledged worker 0's push seq 2 in epoch 0" in first.message and "does not hold it" in first.message
    assert {v.rule for v in check_run(tmp_path).violations} == {1, 2}  # and the worker's write is lost


def test_two_backups_taking_over_one_epoch_is_a_split_brain(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    run.replica(0, "primary", A)
    b, c = run.replica(0, "backup", B), run.replica(0, "backup", C)
    b("epoch", epoch=1, role="primary", primary=B)
    line = c("epoch", epoch=1, role="primary", primary=C)
    assert "two primaries in one epoch" in only(check_run(tmp_path), 2, c.file, line).message


def test_a_worker_taking_an_answer_from_an_older_epoch_after_a_newer_one(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0 = run.worker(0)
    p, b = run.replica(0, "primary", A), run.replica(0, "backup", B, primary=A)
    run.step(w0, p, seq=1, clock=0, backups=(b,))
    b("epoch", epoch=1, role="primary", primary=B)
    run.push(w0, 2, 1, to=B)
    b.apply(0, 2, 1, epoch=1)
    run.ack(w0, b, 2, epoch=1)
    line = run.answer(w0, p, 2, 2, epoch=0)  # a late answer of the old primary, taken
    assert "from epoch 0 of shard 0 after one from epoch 1" in only(check_run(tmp_path), 2, w0.file, line).message


# --- rule 3 -----------------------------------------------------------------------------------------------

def test_a_sync_commit_with_fewer_pushes_than_it_needs(tmp_path):
    run = RunFolder(tmp_path, mode="sync")
    w0, w1 = run.worker(0), run.worker(1)
    p = run.replica(0, "primary", A)
    run.push(w0, 1, 0)
    p.apply(0, 1, 0)
    run.ack(w0, p, 1)
    run.push(w1, 1, 0)
    line = p.commit(0, [0], need=2)  # worker 1's push not in yet
    first = only(check_run(tmp_path), 3, p.file, line)
    assert "holds the pushes of 1 workers still pushing ({0}) and needs exactly 2; {1} had not pushed it" \
        in first.message


def test_a_sync_commit_that_waited_for_more_than_backup_workers_allow(tmp_path):
    run = RunFolder(tmp_path, mode="sync", workers=3, backup_workers=1)
    ws, p = [run.worker(w) for w in range(3)], run.replica(0, "primary", A)
    for w in ws:
        run.push(w, 1, 0)
        p.apply(w.w, 1, 0)
        run.ack(w, p, 1)
    line = p.commit(0, [0, 1, 2], need=2)  # the third should have been dropped as late
    assert "needs exactly 2" in only(check_run(tmp_path), 3, p.file, line).message


def test_a_clock_committed_twice(tmp_path):
    run = RunFolder(tmp_path, mode="sync")
    w0, w1 = run.worker(0), run.worker(1)
    p = run.replica(0, "primary", A)
    sync_clock(run, [w0, w1], p, 0, (1, 1))
    for w in (w0, w1):  # clock 0 again: late pushes the shard should have dropped
        run.push(w, 3, 0)
        p.apply(w.w, 3, 0)
    line = p.commit(0, [0, 1], need=2)
    assert "clock 0 commits a second time" in only(check_run(tmp_path), 3, p.file, line).message


# --- rule 4 -----------------------------------------------------------------------------------------------

def test_an_ssp_answer_beyond_the_bound(tmp_path):
    run = ssp_case(tmp_path, slowest_leaves=False)
    p = next(f for f in (tmp_path / "history").iterdir() if f.name.startswith("shard-0"))
    line = next(i for i, text in enumerate(p.read_text().splitlines(), 1) if '"answer"' in text and '"clock": 2' in text)
    first = only(check_run(tmp_path), 4, p.name, line)
    assert "clock 2 while the slowest active worker (worker 1) is at clock 0: 2 ahead, and the bound is 1" \
        in first.message


# --- rule 5 -----------------------------------------------------------------------------------------------

def test_a_summary_count_that_differs_from_the_lineage(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0, p = run.worker(0), run.replica(0, "primary", A)
    run.step(w0, p, seq=1, clock=0)
    run.step(w0, p, seq=2, clock=1)
    run.record("server-0", pushes=2, updates_applied=2, version=2)
    run.record("summary", complete=True, pushes=2, updates_applied=3, updates_applied_per_shard=[2])
    first = only(check_run(tmp_path), 5, "summary.json", None)
    assert "`updates_applied` is 3, but shard 0's final lineage" in first.message and "holds 2" in first.message


@pytest.mark.parametrize("faults", [
    {"nemesis": {"faults": [{"kind": "kill", "target": "worker:1", "done": True}]}},
    {"worker_restarts": [{"rank": 1, "joined": True}]},
    {"deaths": [{"process": "worker-1", "rank": 1, "survived": True}]}])  # killed from outside: experiments/launcher/deaths
def test_the_summarys_pushes_are_not_held_against_the_lineage_once_a_worker_life_died(tmp_path, faults):
    run = RunFolder(tmp_path, mode="async")
    w0, w1, p = run.worker(0), run.worker(1), run.replica(0, "primary", A)
    run.step(w0, p, seq=1, clock=0)
    run.step(w1, p, seq=1, clock=0)  # a life killed after this step: it wrote no record, the summary lacks its step
    run.record("server-0", pushes=2, updates_applied=2, version=2)
    run.record("summary", complete=True, pushes=1, updates_applied=2, updates_applied_per_shard=[2])
    assert not check_run(tmp_path).ok  # without a word of a death, the summary's count is wrong
    run.record("summary", complete=True, pushes=1, updates_applied=2, updates_applied_per_shard=[2], faults=faults)
    result = check_run(tmp_path)
    assert result.ok, result.line()
    assert any(s.startswith("summary.json `pushes`: ") for s in result.skipped)


def test_a_server_record_whose_pushes_leave_out_the_dropped_ones(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0, p = run.worker(0), run.replica(0, "primary", A)
    run.step(w0, p, seq=1, clock=0)
    run.push(w0, 2, 1)
    p("drop", w=0, seq=2, clock=1, why="nonfinite", epoch=0)
    run.ack(w0, p, 2, dropped="nonfinite")
    run.record("server-0", pushes=1, updates_applied=1, version=1)  # pushes counts the dropped one too
    assert "`pushes` is 1" in only(check_run(tmp_path), 5, "server-0.json", None).message


# --- input ------------------------------------------------------------------------------------------------

def test_a_torn_line_in_the_middle_of_a_file_is_a_corrupt_history(tmp_path):
    run = ssp_case(tmp_path, slowest_leaves=True)
    w = run.worker(1)
    w.append('{"ev": "push", "w": 1, "seq": 7, "sh\n')
    run.push(w, 8, 0)
    with pytest.raises(HistoryError, match=rf"{w.file}:2: not a whole JSON event.*corrupt"):
        check_run(tmp_path)


@pytest.mark.parametrize("case, message", [
    ("no history", "does not exist: the run recorded no history"),
    ("no config", "is not a run folder"),
    ("a state nobody sent", "that no file of shard 0 records sending"),
])
def test_what_cannot_be_checked_is_bad_input(tmp_path, case, message):
    if case == "no config":
        (tmp_path / "history").mkdir()
    else:
        run = RunFolder(tmp_path, mode="async")
        if case == "no history":
            (tmp_path / "history").rmdir()
        else:
            b = run.replica(0, "backup", B, primary=A)
            b("state", n=3, epoch=0, **{"from": A})
    with pytest.raises(HistoryError, match=message):
        check_run(tmp_path)


def test_the_result_as_data(tmp_path):
    run = RunFolder(tmp_path, mode="async")
    w0, p = run.worker(0), run.replica(0, "primary", A)
    run.step(w0, p, seq=1, clock=0)
    p.apply(0, 1, 0)
    data = check_run(tmp_path).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert not data["ok"] and data["counts"]["applied"] == 2 and len(data["violations"]) == 1
    assert data["violations"][0].startswith(f"{p.file}:6: rule 1 (nothing lost, nothing twice): ")

