"""Sync's quorum (`--quorum Q`, psrv/server/consistency/quorum.py) on the default job with a slow worker: the fast
workers never wait for it, every merge holds Q distinct workers, `--quorum-max-age` drops what is too old and
`--quorum-wait` holds fresh pulls for their merge,
as the run's recorded history shows (the checker's rule 3, experiments/launcher/history/barrier.py). A real
`psrv run`: its processes record the history."""
import json

import pytest

from psrv.experiments.launcher.history import check_run
from tests.helpers import psrv_run

ARGS = ("--mode", "sync", "--workers", "3", "--steps", "60", "--compute-ms", "2", "--straggler", "2:6")


def _shards(out, n=2) -> list[dict]:
    return [json.loads((out / f"server-{i}.json").read_text()) for i in range(n)]


@pytest.mark.timeout(150)
def test_a_quorum_of_two_never_waits_for_the_slow_worker_and_its_history_is_clean(tmp_path):
    s = psrv_run(tmp_path, *ARGS, "--quorum", "2", timeout=120)
    assert (s["mode"], s["quorum"], s["quorum_max_age"]) == ("sync", 2, 0)
    assert s["eval_accuracy"] >= 0.85 and s["final_loss"] < s["initial_loss"], s
    pushes = 3 * 60
    for shard in _shards(tmp_path):
        assert shard["pushes"] == shard["pushes_applied"] == pushes and shard["dropped"] == {}, shard
        # the fast pair's pushes merge among themselves: more merges than sync's 60 clocks, fewer than pushes
        assert 60 < shard["updates_applied"] < pushes, shard
        ages = {int(k): v for k, v in shard["staleness_histogram"].items()}
        assert sum(ages.values()) == pushes and max(ages) >= 2, ages  # the slow worker's pushes merge old
    result = check_run(tmp_path)
    assert result.ok, result.line()
    assert result.counts.commits == sum(sh["updates_applied"] for sh in _shards(tmp_path))


@pytest.mark.timeout(150)
def test_quorum_max_age_drops_the_slow_workers_old_pushes_and_says_so(tmp_path):
    s = psrv_run(tmp_path, *ARGS, "--quorum", "2", "--quorum-max-age", "1", timeout=120)
    shards = _shards(tmp_path)
    for shard in shards:
        late = shard["dropped"].get("late", 0)
        assert late > 0 and shard["pushes_applied"] + late == shard["pushes"] == 3 * 60, shard
        assert max(int(k) for k in shard["staleness_histogram"]) <= 1, shard["staleness_histogram"]
    # each shard judges a push's age by its own merges, so the shards may drop different pushes
    assert s["dropped_per_shard"] == [sh["dropped"]["late"] for sh in shards]
    assert s["dropped"] == s["dropped_per_shard"][0]
    result = check_run(tmp_path)  # no merge holds a push older than 1 (rule 3)
    assert result.ok, result.line()


def _commits(out) -> list[dict]:
    """Every merge of shard 0's final primary and its backups, from the recorded history."""
    events = []
    for f in sorted((out / "history").glob("shard-0.*.jsonl")):
        events += [e for e in map(json.loads, f.read_text().splitlines()) if e.get("ev") == "commit"]
    return events


@pytest.mark.timeout(150)
def test_a_grace_window_lets_the_slow_worker_into_merges_and_replicas_close_them_alike(tmp_path):
    """Quorum 1 of 3 with a window of 0.5 s, far more than the slow worker's lag: a merge waits for all three,
    as the backup's lineage shows too, but where the failover (shard 0's primary killed halfway) outlasts the
    window; the history checker holds each merge to its rule."""
    s = psrv_run(tmp_path, *ARGS, "--quorum", "1", "--quorum-grace", "0.5", "--replicas", "1", "--kill-server", "0:30",
                 timeout=120)
    assert s["quorum_grace"] == 0.5 and s["complete"], s
    commits = _commits(tmp_path)
    whole = [e for e in commits if set(e["pushing"]) <= set(e["pushed"])]
    assert len(whole) >= 0.8 * len(commits) and sum(e["due"] for e in commits) <= 0.1 * len(commits), commits
    result = check_run(tmp_path)
    assert result.ok, result.line()
    assert result.counts.epochs > 2  # the backup took shard 0 over


@pytest.mark.timeout(150)
def test_quorum_wait_holds_fresh_pulls_for_their_merge_across_a_failover(tmp_path):
    """--quorum-wait: the fast pair's fresh pushes fill each merge and wait for it, the slow worker's old ones join
    uncounted; shard 0's primary killed halfway, its backup takes over with the held pulls in its state. The
    checker's rule 3 holds every merge to Q fresh pushes and every fresh push's answer to a version its merge
    made (experiments/launcher/history/barrier.py)."""
    s = psrv_run(tmp_path, *ARGS, "--quorum", "2", "--quorum-wait", "--replicas", "1", "--kill-server", "0:30",
                 timeout=120)
    assert s["quorum_wait"] is True and s["complete"], s
    for shard in _shards(tmp_path):
        assert shard["pushes"] == shard["pushes_applied"] == 3 * 60, shard
        ages = {int(k): v for k, v in shard["staleness_histogram"].items()}
        assert ages[0] > 3 * 60 // 2 and max(ages) >= 1, ages  # most pushes fresh, some (the slow one's) old
    result = check_run(tmp_path)
    assert result.ok, result.line()
    assert result.counts.epochs > 2  # the backup took shard 0 over


@pytest.mark.timeout(150)
def test_a_quorum_takes_dynamic_local_steps_whose_pushes_cover_different_steps(tmp_path):
    """auto:8: the slow worker plans fewer inner steps per push; each push says how many (`inner_steps`) and a
    merge weighs it by them (tests/conformance/test_quorum_merge.py checks the weighted mean)."""
    s = psrv_run(tmp_path, *ARGS, "--quorum", "2", "--local-steps", "auto:8", "--inner-optimizer", "sgd",
                 "--inner-lr", "0.05", "--lr", "1.0", timeout=120)
    assert s["complete"] and s["final_loss"] < s["initial_loss"], s
    per_push = {w["rank"]: w["inner_steps_per_push"] for w in map(json.loads, (
        (tmp_path / f"worker-{r}.json").read_text() for r in range(3)))}
    assert min(per_push[2][1:]) < 8 == max(per_push[0]), per_push  # the slow worker's pushes cover fewer
    result = check_run(tmp_path)
    assert result.ok, result.line()


@pytest.mark.timeout(150)
def test_a_quorum_merges_each_fragment_on_its_own_quorum(tmp_path):
    """Decoupled DiLoCo's setting: streaming DiLoCo's fragments (H 4, F 2) under a quorum of 2 of 3, the slow
    worker a fragment behind the others at times: each fragment has merges of its own (the commit's `part`),
    each an update of that fragment, each of two workers' pushes of it while two still push; the history checker
    holds each merge to its part's pushes."""
    s = psrv_run(tmp_path, *ARGS, "--quorum", "2", "--local-steps", "4", "--fragments", "2", "--inner-optimizer",
                 "sgd", "--inner-lr", "0.05", "--lr", "0.7", timeout=120)
    assert s["complete"] and s["final_loss"] < s["initial_loss"], s
    result = check_run(tmp_path)
    assert result.ok, result.line()
    shards = _shards(tmp_path)
    assert all(sh["pushes_applied"] == sh["pushes"] == 3 * 60 // 2 for sh in shards), shards
    merges = [e for e in _commits(tmp_path) if e["pushed"]]
    assert len({e["part"] for e in merges}) == 2 and shards[0]["updates_applied"] == len(merges), merges[:4]
    assert all(len(e["pushed"]) >= 2 for e in merges if len(e["pushing"]) >= 2), merges


@pytest.mark.timeout(150)
def test_an_adaptive_window_closes_merges_without_the_slow_worker_and_replicas_close_them_alike(tmp_path):
    """Quorum 2 of 3 with an adaptive window of at most 0.5 s: where the slow worker (6x) is not expected before
    the fast pair pushes again, a merge closes at its Q-th push (the fixed window above waits for it every
    time); the backup's lineage agrees across the failover (shard 0's primary killed halfway), rule 3 holds."""
    s = psrv_run(tmp_path, *ARGS, "--quorum", "2", "--quorum-grace", "0.5", "--quorum-grace-adaptive",
                 "--replicas", "1", "--kill-server", "0:30", timeout=120)
    assert s["quorum_grace_adaptive"] and s["complete"], s
    commits = _commits(tmp_path)
    without_slow = [e for e in commits if 2 in e["pushing"] and 2 not in e["pushed"]]
    assert len(without_slow) >= 10 and all(e["due"] for e in without_slow), commits
    result = check_run(tmp_path)
    assert result.ok, result.line()
    assert result.counts.epochs > 2
