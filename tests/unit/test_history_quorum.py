"""The history checker's rule 3 under a quorum (experiments/launcher/history/barrier.py `Merges`, docs/history.md):
merges of any clocks, per fragment (`part`), their quorum, grace window, age rule and version, on histories written
by hand: clean ones it must pass, and one per way to break the rule, which it must name."""
import pytest

from psrv.experiments.launcher.history import check_run
from tests.history_builder import RunFolder
from tests.unit.test_history_check import A, only


def quorum_push(run, w, p, seq, clock, *, age=0, part=None):
    run.push(w, seq, clock)
    p.apply(w.w, seq, clock, age=age, part=part)
    run.ack(w, p, seq)


def test_a_clean_quorum_run_merges_any_clocks_and_a_workers_second_push(tmp_path):
    """Quorum 2 of 3: worker 0 pushes twice before worker 2's first closes the merge; then 1 and 0."""
    run = RunFolder(tmp_path, mode="sync", workers=3, quorum=2, quorum_max_age=3)
    ws, p = [run.worker(w) for w in range(3)], run.replica(0, "primary", A)
    quorum_push(run, ws[0], p, 1, 0)
    quorum_push(run, ws[0], p, 2, 1)
    quorum_push(run, ws[2], p, 1, 0)
    p.commit(0, [0, 2], need=2)
    quorum_push(run, ws[1], p, 1, 0, age=1)
    quorum_push(run, ws[0], p, 3, 2, age=1)
    p.commit(1, [0, 1], need=2)
    result = check_run(tmp_path)
    assert result.ok, result.line()
    assert result.counts.commits == 2


def test_quorum_merges_of_fragments_each_take_their_own_parts_pushes_and_step_once(tmp_path):
    """Streaming DiLoCo under a quorum: each fragment (`part`) merges its own pushes. Worker 0's push of part 8
    waits in its merge while part 0's closes; a commit of part 8 that lists a push of part 0, or moves the
    version by two, is flagged."""
    run = RunFolder(tmp_path, mode="sync", workers=2, quorum=2)
    ws, p = [run.worker(w) for w in range(2)], run.replica(0, "primary", A)
    quorum_push(run, ws[0], p, 1, 0, part=0)
    quorum_push(run, ws[0], p, 2, 1, part=8)
    quorum_push(run, ws[1], p, 1, 0, part=0)
    p.commit(0, [0, 1], need=2, part=0)
    quorum_push(run, ws[1], p, 2, 1, part=8)
    p.commit(1, [0, 1], need=2, part=8)
    result = check_run(tmp_path)
    assert result.ok, result.line()
    quorum_push(run, ws[0], p, 3, 2, age=1, part=0)
    quorum_push(run, ws[1], p, 3, 2, age=1, part=8)
    line = p.commit(2, [0, 1], need=2, part=8)  # worker 0's push went to part 0's merge
    assert "merge 2 lists workers {0, 1}, but the lineage accumulated the pushes of {1}" \
        in only(check_run(tmp_path), 3, p.file, line).message


def test_a_quorum_merge_must_move_the_version_by_one(tmp_path):
    run = RunFolder(tmp_path, mode="sync", workers=2, quorum=2)
    ws, p = [run.worker(w) for w in range(2)], run.replica(0, "primary", A)
    for seq in (1, 2):
        quorum_push(run, ws[0], p, seq, seq - 1, age=seq - 1)
        quorum_push(run, ws[1], p, seq, seq - 1, age=seq - 1)
    p.commit(0, [0, 1], need=2)
    line = p("commit", clock=1, version=p.version + 2, pushed=[0, 1], need=2, active=[0, 1])
    assert "merge 1 moved the version from 1 to 3, but it took 1 step" in only(check_run(tmp_path), 3, p.file,
                                                                             line).message


def test_a_quorum_merge_of_one_worker_twice_is_short_of_its_quorum(tmp_path):
    run = RunFolder(tmp_path, mode="sync", workers=3, quorum=2)
    ws, p = [run.worker(w) for w in range(3)], run.replica(0, "primary", A)
    quorum_push(run, ws[0], p, 1, 0)
    quorum_push(run, ws[0], p, 2, 1)
    line = p.commit(0, [0], need=2)
    assert "merge 0 holds the pushes of 1 workers still pushing ({0}) and needs exactly 2" \
        in only(check_run(tmp_path), 3, p.file, line).message


def test_a_quorum_merge_that_waited_for_more_than_its_quorum(tmp_path):
    run = RunFolder(tmp_path, mode="sync", workers=3, quorum=2)
    ws, p = [run.worker(w) for w in range(3)], run.replica(0, "primary", A)
    for w in ws:
        quorum_push(run, w, p, 1, 0)
    line = p.commit(0, [0, 1, 2], need=3)
    assert "waited for 3 workers, but with {0, 1, 2} still pushing and quorum 2 it needs 2" \
        in only(check_run(tmp_path), 3, p.file, line).message


@pytest.mark.parametrize("due", [True, False])
def test_a_grace_merge_holds_more_than_its_quorum_only_once_its_window_is_over(tmp_path, due):
    run = RunFolder(tmp_path, mode="sync", workers=3, quorum=1, quorum_grace=0.5)
    ws, p = [run.worker(w) for w in range(3)], run.replica(0, "primary", A)
    quorum_push(run, ws[0], p, 1, 0)
    quorum_push(run, ws[1], p, 1, 0)
    line = p.commit(0, [0, 1], need=1, due=due)
    result = check_run(tmp_path)
    if due:
        assert result.ok, result.line()
    else:
        assert "with its grace window not over, and needs 1" in only(result, 3, p.file, line).message


def test_a_push_older_than_quorum_max_age_in_a_merge(tmp_path):
    run = RunFolder(tmp_path, mode="sync", workers=2, quorum=2, quorum_max_age=2)
    ws, p = [run.worker(w) for w in range(2)], run.replica(0, "primary", A)
    quorum_push(run, ws[0], p, 1, 0)
    run.push(ws[1], 1, 0)
    line = p.apply(1, 1, 0, age=3)
    run.ack(ws[1], p, 1)
    p.commit(0, [0, 1], need=2)
    assert "3 merges old went into merge 0; --quorum-max-age 2 drops it" \
        in only(check_run(tmp_path), 3, p.file, line).message


def test_a_quorum_merge_that_counts_a_finished_worker_as_pushing_is_flagged(tmp_path):
    """A replica whose controller lost worker 0's finish (a backup that joined after it, before 8f765fc) says 0 is
    still pushing: the lineage's `member` events say it is not. Flagged at the merge whose `pushing` says so, even
    where the merge's pushes fill the quorum either way."""
    run = RunFolder(tmp_path, mode="sync", workers=3, quorum=2)
    ws, p = [run.worker(w) for w in range(3)], run.replica(0, "primary", A)
    quorum_push(run, ws[0], p, 1, 0)
    p("member", w=0, what="finish", epoch=0)
    quorum_push(run, ws[1], p, 1, 0)
    quorum_push(run, ws[2], p, 1, 0)
    p.commit(0, [0, 1, 2], need=2, pushing=[1, 2])
    result = check_run(tmp_path)
    assert result.ok, result.line()
    quorum_push(run, ws[1], p, 2, 1)
    quorum_push(run, ws[2], p, 2, 1)
    line = p.commit(1, [1, 2], need=2, pushing=[0, 1, 2])
    assert "merge 1 says {0, 1, 2} are pushing, but the lineage's `member` events make them {1, 2}" \
        in only(check_run(tmp_path), 3, p.file, line).message
