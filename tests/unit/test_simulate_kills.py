"""psrv simulate's kills on psrv run's nemesis schedule (`--nemesis`, `--restart-workers`, `--fail-down`,
`--worker-timeout`; psrv/experiments/simulate/kills.py): the ranks and times the launcher's nemesis draws; a sync
barrier that waits for a killed worker until its new life says HELLO, then lets it skip to the clock after the open
one, as a restarted psrv worker does; async, where it starts again at the round it lost; a kill with no restart
left, dropped after the worker timeout; and the settings refused where the simulator does not model them. Each
wall time is worked out by hand from 1 s steps."""
import pytest

from psrv.config import ConfigError, from_dict
from psrv.experiments.launcher.nemesis.schedule import Timeline
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.run import simulate

STEP = 1.001  # s a step: --compute-ms 1000 and the job's own 1 ms
SLACK = 0.01  # the messages' latencies, 0.1 ms each, over a run


def sim(mode="sync", workers=2, nemesis="kill worker:1 at 2.5s", restarts=1, down=2.0, out=None, **tree) -> dict:
    data = {"mode": mode, "job": {"steps": 10}, "faults": {"compute_ms": 1000.0},
            "cluster": {"workers": workers, "servers": 1}, "nemesis": {"schedule": nemesis},
            "restarts": {"workers": restarts}, "simulate": {"fail_down": down, "goodput": True}, **tree}
    return simulate(from_dict(SimulationConfig, data), out=out)


@pytest.mark.parametrize("mode, rank1", [("sync", [4, 5, 6, 7, 8, 9]), ("async", [2, 3, 4, 5, 6, 7, 8, 9])])
def test_a_killed_lifes_steps_are_not_in_steps_csv_as_in_a_real_runs(tmp_path, mode, rank1):
    """A killed psrv worker writes no record, so a real run's steps.csv has none of its dead life's steps: rank 1's
    rows are its new life's only (sync: from clock 4; async: from its lost round, step 2)."""
    import csv
    sim(mode=mode, out=tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "steps.csv")))
    assert [int(r["step"]) for r in rows if r["worker"] == "1"] == rank1
    assert [int(r["step"]) for r in rows if r["worker"] == "0"] == list(range(10))


def test_the_kills_are_the_ranks_and_times_the_launchers_nemesis_draws():
    s = sim(workers=8, nemesis="every 5s fixed kill on worker:*", restarts=100, down=0.5,
            job={"steps": 40}, simulate={"fail_down": 0.5}, seed=3)
    due = Timeline("every 5s fixed kill on worker:*", seed=3, servers=1, workers=8)
    real = [(p.at.seconds, p.targets[0].index) for t in range(1, 60) for p in due.due(seconds=float(t), step=0)]
    made = [(k["t"], k["rank"]) for k in s["kills"]]
    assert len(made) >= 7 and made == real[:len(made)]
    assert all(k["restarted"] for k in s["kills"]) and s["failures"] == len(made)


def test_a_sync_barrier_waits_for_the_killed_worker_until_its_new_life_then_it_skips_to_the_next_clock():
    """Rank 1 dies at 2.5 s in step 2. Rank 0 pushes clock 2 at 3 s and waits: the shard still counts rank 1 until
    its new life's HELLO at 4.5 s, when clock 2 closes without it. Rank 0 goes on with clock 3; rank 1 joins at the
    clock after that open one, 4, and never does steps 2 and 3: it pushes clock 4 at 5.5 s and waits for rank 0's
    (6.5 s), then both do steps 5-9: rank 0's 10 steps and its 1.5 s held, 11.5 s."""
    s = sim()
    wall = 1.5 + 10 * STEP
    assert s["wall_seconds"] == pytest.approx(wall, abs=SLACK)
    assert s["lost_samples"] == 1 * 32 and s["skipped_samples"] == 2 * 32
    assert s["pushes"] == 10 + 8 and s["useful_samples"] == 18 * 32
    assert s["goodput_end_to_end"] == pytest.approx((18 / wall) / (20 / (10 * STEP)), abs=1e-3)


def test_under_async_the_restarted_worker_starts_again_at_the_round_it_lost():
    """Rank 1 dies at 2.5 s in step 2 and comes back at 4.5 s at clock 2 (its pushes so far): its 8 steps left end
    at 4.5 + 8 = 12.5 s; rank 0 never waits."""
    s = sim(mode="async")
    assert s["wall_seconds"] == pytest.approx(4.5 + 8 * STEP, abs=SLACK)
    assert s["lost_samples"] == 32 and s["skipped_samples"] == 0 and s["pushes"] == 20


def test_a_kill_with_no_restart_left_is_dropped_after_the_worker_timeout_and_its_steps_never_done():
    """No restart: the shard lets rank 1 go 3 s after the kill (--worker-timeout 3), at 5.5 s: clock 2 closes, and
    rank 0 does its 8 steps left from there; rank 1's 8 are never done."""
    s = sim(restarts=0, server={"worker_timeout": 3.0}, simulate={"goodput": True})
    assert s["wall_seconds"] == pytest.approx(5.5 + 7 * STEP, abs=SLACK)
    assert s["kills"] == [{"t": 2.5, "rank": 1, "restarted": False}]
    assert s["skipped_samples"] == 8 * 32 and s["pushes"] == 12


def test_a_restart_slower_than_the_worker_timeout_is_let_go_first_and_joins_later():
    """Down 4 s, timeout 1 s: the shard lets rank 1 go at 3.5 s (clock 2 closes then) and its new life joins at
    6.5 s."""
    s = sim(down=4.0, server={"worker_timeout": 1.0})
    held = sim(down=4.0, server={"worker_timeout": 5.0})
    assert s["wall_seconds"] < held["wall_seconds"]
    assert s["wall_seconds"] == pytest.approx(0.5 + 10 * STEP, abs=SLACK)  # rank 0 held 0.5 s at clock 2


@pytest.mark.parametrize("tree, key", [
    ({"nemesis": {"schedule": "pause worker:1 at 2s for 1s"}}, "nemesis.schedule"),
    ({"nemesis": {"schedule": "kill primary:0 at 2s"}}, "nemesis.schedule"),
    ({"nemesis": {"schedule": "kill worker:1 at step 3"}}, "nemesis.schedule"),
    ({"nemesis": {"schedule": "kill worker:1 at 2s"}, "simulate": {"fail_mtbf": 5.0}}, "simulate.fail_mtbf"),
    ({"nemesis": {"schedule": "kill worker:1 at 2s"}, "simulate": {"level": "learning"}, "job": {"steps": 10}},
     "simulate.level"),
    ({"nemesis": {"schedule": "kill worker:1 at 2s"}, "hierarchy": {"regions": 2, "region_every": 4},
      "mode": "async"}, "nemesis.schedule"),
    ({"restarts": {"workers": 1}}, "restarts.workers"),
    ({"server": {"worker_timeout": 3.0}}, "server.worker_timeout"),
    ({"simulate": {"fail_down": 2.0}}, "simulate.fail_down"),
])
def test_what_the_simulator_does_not_model_is_refused(tree, key):
    data = {"cluster": {"workers": 4, "servers": 1}, **tree}
    with pytest.raises(ConfigError) as exc:
        from_dict(SimulationConfig, data)
    assert exc.value.key == key, exc.value


def test_the_printed_summary_says_what_the_kills_did(tmp_path, capsys):
    from psrv.cli.main import main
    assert main(["simulate", "--mode", "sync", "--workers", "2", "--servers", "1", "--steps", "10", "--compute-ms",
                 "1000", "--nemesis", "kill worker:1 at 2.5s", "--restart-workers", "1", "--fail-down", "2",
                 "--out", str(tmp_path)]) == 0
    assert ("kills          1 (rank 1 at 2.5s); 1 restarted, 0 left behind; samples lost 32, never done 64"
            in capsys.readouterr().out)
