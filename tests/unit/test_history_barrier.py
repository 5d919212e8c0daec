"""The checker's barrier and bound agree with the controllers (psrv/server/consistency) on the corner cases they
allow: a worker that pushed then left, backup workers and the straggler's late push, a skipped non-finite push,
a worker's final pull. A checker that flags what the server rightly does would be noise."""
from psrv.experiments.launcher.history import check_run
from tests.history_builder import RunFolder


def pushed(run, p, w, seq, clock):
    run.push(w, seq, clock)
    p.apply(w.w, seq, clock)
    run.ack(w, p, seq)


def test_a_worker_that_pushed_then_left_stays_in_the_sum_and_out_of_the_quorum(tmp_path):
    run = RunFolder(tmp_path, mode="sync", workers=3)
    ws, p = [run.worker(w) for w in range(3)], run.replica(0, "primary")
    pushed(run, p, ws[0], 1, 0)
    p("member", w=0, what="leave")
    pushed(run, p, ws[1], 1, 0)
    pushed(run, p, ws[2], 1, 0)
    p.commit(0, [0, 1, 2], need=2, active=[1, 2])
    result = check_run(tmp_path)
    assert result.ok, result.line()


def test_backup_workers_commit_on_n_minus_b_and_the_stragglers_push_is_dropped_late(tmp_path):
    run = RunFolder(tmp_path, mode="sync", workers=3, backup_workers=1)
    ws, p = [run.worker(w) for w in range(3)], run.replica(0, "primary")
    pushed(run, p, ws[0], 1, 0)
    pushed(run, p, ws[2], 1, 0)
    p.commit(0, [0, 2], need=2)
    run.push(ws[1], 1, 0)
    p("drop", w=1, seq=1, clock=0, why="late", epoch=0)
    run.ack(ws[1], p, 1, dropped="late")
    result = check_run(tmp_path)
    assert result.ok, result.line()


def test_a_clock_whose_only_other_push_was_non_finite_commits_with_fewer_than_need(tmp_path):
    run = RunFolder(tmp_path, mode="sync")
    w0, w1, p = run.worker(0), run.worker(1), run.replica(0, "primary")
    pushed(run, p, w0, 1, 0)
    run.push(w1, 1, 0)
    p("drop", w=1, seq=1, clock=0, why="nonfinite", epoch=0)
    p.commit(0, [0], need=2)
    run.ack(w1, p, 1, dropped="nonfinite")
    result = check_run(tmp_path)
    assert result.ok, result.line()


def test_a_finished_worker_no_longer_holds_the_barrier(tmp_path):
    run = RunFolder(tmp_path, mode="sync")
    w0, w1, p = run.worker(0), run.worker(1), run.replica(0, "primary")
    p("member", w=1, what="finish")  # its final pull came: it pushes no more
    pushed(run, p, w0, 1, 0)
    p.commit(0, [0], need=1)
    result = check_run(tmp_path)
    assert result.ok, result.line()


def test_an_ssp_refused_push_moves_no_clock_and_a_rejoined_worker_counts_again(tmp_path):
    run = RunFolder(tmp_path, mode="ssp", staleness=0)
    w0, w1, p = run.worker(0), run.worker(1), run.replica(0, "primary")
    run.step(w1, p, seq=1, clock=0)  # clock 1 while worker 0 is at 0: over s = 0 ...
    assert [v.rule for v in check_run(tmp_path).violations] == [4]
    run2 = RunFolder(tmp_path / "left", mode="ssp", staleness=0)
    w0, w1, p = run2.worker(0), run2.worker(1), run2.replica(0, "primary")
    p("member", w=0, what="lost")
    run2.step(w1, p, seq=1, clock=0)  # ... unless worker 0 is out of the active set
    p("member", w=0, what="join")
    run2.push(w0, 1, 0)
    p("drop", w=0, seq=1, clock=0, why="invalid", epoch=0)  # refused: its clock stays 0
    line = p("answer", w=1, seq=2, clock=1, version=1, epoch=0)
    first = check_run(run2.dir).violations[0]
    assert (first.rule, first.line) == (4, line)
