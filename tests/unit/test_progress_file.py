"""A worker's progress file (psrv/client/steplog.py) is replaced whole: the launcher reads it at any moment
(psrv run's kills and deaths record worker 0's step from it), and one truncated then written was read as
empty, 0 steps, in CI's run of test_run_deaths."""
import threading

from psrv.client.steplog import RecordFiles, StepLog


def test_a_reader_never_sees_the_progress_file_empty_while_it_is_written(tmp_path):
    progress = tmp_path / "worker-0.progress"
    log = StepLog(RecordFiles(progress=progress))
    log.loop_began()
    done, seen = threading.Event(), []

    def reader():
        while not done.is_set():
            seen.append(progress.read_text())
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(2000):  # written in place, a reader here saw it empty in most of its reads
            log.loop_began()
    finally:
        done.set()
        thread.join()
    assert seen and "" not in seen and set(seen) == {"0"}
