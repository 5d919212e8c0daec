"""Sync's quorum (`--quorum Q`, psrv/server/consistency/quorum.py) on the default job with a slow worker: the fast
workers never wait for it, every merge holds Q distinct workers, and `--quorum-max-age` drops what is too old,
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
    assert [sh["dropped"]["late"] for sh in shards] == [s["dropped"]] * 2, s  # a push goes to both shards
    result = check_run(tmp_path)  # no merge holds a push older than 1 (rule 3)
    assert result.ok, result.line()
