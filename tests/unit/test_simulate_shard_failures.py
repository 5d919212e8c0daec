"""psrv simulate's shard failures (`--shard-fail-mtbf`, `--shard-fail-down`;
psrv/experiments/simulate/shard_failures.py): psrv's failover loses no update, so every push is applied and every
clock closes; a shard's thread works past every failover it meets, checked against the failovers written out from
the same draws; one worker's wall time is the clean one plus what each failover cost its shard's thread, replayed
from those draws; a failure far past the run changes nothing; goodput is useful samples/s over the run without
failures."""
import json
import random
import re

import pytest

from psrv.config import ConfigError, from_dict
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.shard_failures import ShardFailures
from tests.unit.test_simulate_failures import COMPUTE, sim  # the same 60 steps of 21 ms as the workers' failures


@pytest.mark.parametrize("mode", ["sync", "async", "ssp"])
def test_a_failover_loses_no_update_and_costs_goodput(mode):
    s = sim(mode=mode, cluster={"workers": 6, "servers": 2},
            simulate={"shard_fail_mtbf": 0.3, "shard_fail_down": 0.1, "goodput": True})
    clean = sim(mode=mode, cluster={"workers": 6, "servers": 2})
    assert s["shard_failures"] > 3 and clean["shard_failures"] == 0, (s["shard_failures"], clean["shard_failures"])
    assert s["pushes"] == 6 * 60 and s["updates_applied_per_shard"] == clean["updates_applied_per_shard"]
    assert s["updates_applied"] == (60 if mode == "sync" else 6 * 60)  # every clock closed, every push applied
    assert s["lost_samples"] == 0 and s["failures"] == 0  # the workers lose nothing
    assert s["wall_seconds"] > clean["wall_seconds"] and 0 < s["goodput_end_to_end"] < 1
    assert s["useful_samples_per_second_end_to_end"] == pytest.approx(
        s["goodput_end_to_end"] * clean["useful_samples_per_second_end_to_end"])


def test_one_workers_wall_time_is_the_clean_one_plus_what_each_failover_costs_its_shard():
    """1 worker, async, one shard whose thread takes 3 ms a push: a failure while the push is on the thread has it
    done again after the takeover, one before it arrives holds it until the takeover; the failures drawn as
    shard_failures.py draws them, and counted up to the last step's end."""
    mtbf, down, latency, server = 0.15, 0.04, 0.0001, 0.003
    s = sim(mode="async", cluster={"workers": 1, "servers": 1},
            simulate={"shard_fail_mtbf": mtbf, "shard_fail_down": down, "server_ms": server * 1000,
                      "bandwidth_gbps": 1e6})
    draw = random.Random("shard 0 0")
    fail, failures, t = draw.expovariate(1 / mtbf), 0, 0.0
    hit = 0
    for _ in range(60):
        start = t + COMPUTE + latency  # the push reaches the shard
        while start + server > fail:  # a failure before the push is done
            failures += 1
            hit += 1
            back = fail + down
            start = max(start, back)  # held until the takeover, or done again after it
            fail = back + draw.expovariate(1 / mtbf)
        t = start + server + latency  # the reply back
    while fail < t:  # failures while the shard had nothing to do
        failures += 1
        fail = fail + down + draw.expovariate(1 / mtbf)
    assert hit > 3, "the draws should hit some pushes"
    assert s["shard_failures"] == failures
    assert s["wall_seconds"] == pytest.approx(t, rel=1e-6)


def test_work_on_a_shards_thread_ends_past_every_failover_it_meets_whatever_the_order_it_is_asked_in():
    """ShardFailures.run against the failovers written out from the same draws: work of `cost` from `start` ends at
    the first t >= start whose span [t, t + cost] holds no failure and lies in no failover; asked in any order, with
    costs from none to longer than a failover."""
    mtbf, down = 0.1, 0.03
    failures = ShardFailures(2, mtbf=mtbf, down=down, seed=7)
    windows = failovers(seed=7, shard=1, mtbf=mtbf, down=down, through=5.0)

    def expected(start: float, cost: float) -> float:
        t = start
        for failed, back in windows:
            if t < back and failed < t + cost or failed <= t < back:
                t = max(t, back)
        return t + cost

    asks = random.Random(0)
    for _ in range(2000):
        start, cost = asks.uniform(0, 4.0), asks.choice([0.0, 0.001, asks.uniform(0, 0.05)])
        assert failures.run(1, start, cost) == pytest.approx(expected(start, cost), abs=1e-12), (start, cost)
    # counted up to an end whatever the threads did: shard 0 was never asked about
    assert failures.until(4.0) == sum(failed < 4.0 for s in (0, 1) for failed, _ in
                                      failovers(seed=7, shard=s, mtbf=mtbf, down=down, through=5.0))


def failovers(*, seed: int, shard: int, mtbf: float, down: float, through: float) -> list[tuple[float, float]]:
    """A shard's (failure, takeover) times up to `through`, written out from the description of its draws."""
    draw, back, out = random.Random(f"shard {seed} {shard}"), 0.0, []
    while back < through:
        failed = back + draw.expovariate(1 / mtbf)
        back = failed + down
        out.append((failed, back))
    return out


def test_a_failure_past_the_runs_end_changes_nothing():
    base = {"mode": "sync", "cluster": {"workers": 4, "servers": 2}, "simulate": {"server_ms": 1.0}}
    clean = sim(**base)
    far = sim(**{**base, "simulate": {"server_ms": 1.0, "shard_fail_mtbf": 1e9}})
    assert far["shard_failures"] == 0
    assert far["wall_seconds"] == pytest.approx(clean["wall_seconds"], rel=1e-12)
    assert far["wait_seconds"] == pytest.approx(clean["wait_seconds"], rel=1e-9)


def test_the_same_seed_fails_the_same_shards_and_another_does_not():
    one = sim(mode="async", cluster={"workers": 4, "servers": 2}, simulate={"shard_fail_mtbf": 0.2})
    again = sim(mode="async", cluster={"workers": 4, "servers": 2}, simulate={"shard_fail_mtbf": 0.2})
    assert {**again, "simulator_seconds": 0} == {**one, "simulator_seconds": 0}
    other = sim(mode="async", cluster={"workers": 4, "servers": 2}, simulate={"shard_fail_mtbf": 0.2}, seed=1)
    assert other["wall_seconds"] != one["wall_seconds"]


def test_shard_failures_are_refused_where_they_mean_nothing():
    with pytest.raises(ConfigError, match="shard_fail_down: is how long a failed shard waits"):
        from_dict(SimulationConfig, {"simulate": {"shard_fail_down": 2.0}})
    with pytest.raises(ConfigError, match="simulate.shard_fail_mtbf: shard failures with regional shards"):
        from_dict(SimulationConfig, {"mode": "async", "hierarchy": {"regions": 2, "region_every": 4},
                                     "simulate": {"shard_fail_mtbf": 5.0}})


def test_the_printed_summary_says_how_many_failed(tmp_path, capsys):
    from psrv.cli.main import main
    args = ["simulate", "--mode", "async", "--workers", "4", "--servers", "2", "--steps", "60", "--compute-ms", "20"]
    assert main([*args, "--shard-fail-mtbf", "0.2", "--out", str(tmp_path / "failing")]) == 0
    printed = capsys.readouterr().out
    s = json.loads((tmp_path / "failing" / "summary.json").read_text())
    assert s["shard_failures"] > 0
    line = f"workers 0 (0 samples lost), shards {s['shard_failures']} (failed over, nothing lost)"
    assert re.search(rf"^failures +{re.escape(line)}$", printed, re.M), printed
    assert main([*args, "--out", str(tmp_path / "clean")]) == 0
    assert not re.search(r"^failures ", capsys.readouterr().out, re.M)
