"""psrv simulate's failures (`--fail-mtbf`, `--fail-down`; psrv/experiments/simulate/failures.py): every worker still
does all its steps, a failed one's lost steps are counted and done again, a barrier goes on without it, and one
worker's wall time is the clean one plus, per failure, its lost time, its down time and its rejoin's pull, from the
same draws; goodput is useful samples/s over the clean run's."""
import random

import pytest

from psrv.config import ConfigError, from_dict
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.run import simulate

COMPUTE = 0.021  # s a step: the 20 ms of --compute-ms and the job's own 1 ms


def sim(**tree) -> dict:
    data = {"job": {"steps": 60}, "faults": {"compute_ms": 20.0}, **tree}
    return simulate(from_dict(SimulationConfig, data))


@pytest.mark.parametrize("mode", ["sync", "async", "ssp"])
def test_every_worker_finishes_and_the_lost_steps_are_counted(mode):
    s = sim(mode=mode, cluster={"workers": 6, "servers": 2}, simulate={"fail_mtbf": 0.3, "fail_down": 0.1,
                                                                       "goodput": True})
    assert s["failures"] > 5 and s["lost_samples"] > 0, s
    assert s["pushes"] == 6 * 60 and s["useful_samples"] == 6 * 60 * s["batch_size"]  # all done, none dropped
    assert 0 < s["goodput_end_to_end"] < 1
    clean = sim(mode=mode, cluster={"workers": 6, "servers": 2})
    assert clean["failures"] == clean["lost_samples"] == 0 and clean["goodput_end_to_end"] is None
    assert s["wall_seconds"] > clean["wall_seconds"]
    assert s["useful_samples_per_second_end_to_end"] == pytest.approx(
        s["goodput_end_to_end"] * clean["useful_samples_per_second_end_to_end"])


def test_one_workers_wall_time_is_the_clean_one_plus_what_each_failure_costs():
    """1 worker, async, one shard, no network cost to speak of: each failure at t costs the compute of its round up
    to t (lost, done again: with H = 1 the step under way), the down time and the rejoin's pull (two latencies), the
    failure times drawn as failures.py draws them."""
    mtbf, down, latency = 0.2, 0.05, 0.0001
    s = sim(mode="async", cluster={"workers": 1, "servers": 1},
            simulate={"fail_mtbf": mtbf, "fail_down": down, "bandwidth_gbps": 1e6})
    draw = random.Random(0 * 1_000_003 + 0)
    t, done, step_start, failures, lost = 0.0, 0, 0.0, 0, 0
    next_fail = draw.expovariate(1 / mtbf)
    while done < 60:
        end = step_start + COMPUTE + 2 * latency  # compute, then the push out and its reply back
        if next_fail < end:  # the step under way is lost
            failures += 1
            lost += 1 if next_fail >= step_start else 0
            back = next_fail + down
            step_start = back + 2 * latency  # the rejoin's pull
            next_fail = back + draw.expovariate(1 / mtbf)
            continue
        done, step_start = done + 1, end
    assert s["failures"] == failures and s["lost_samples"] == lost * s["batch_size"]
    assert s["wall_seconds"] == pytest.approx(step_start, rel=1e-3)


def test_a_sync_barrier_goes_on_without_a_failed_worker():
    """While one worker is down the others' clocks close without it: more clocks than a worker's pushes."""
    s = sim(mode="sync", cluster={"workers": 4, "servers": 1}, simulate={"fail_mtbf": 0.2, "fail_down": 0.3})
    assert s["failures"] > 0 and s["updates_applied"] > 60
    assert s["pushes"] == 4 * 60


def test_the_same_seed_fails_the_same_way_and_another_does_not():
    one = sim(mode="async", cluster={"workers": 4}, simulate={"fail_mtbf": 0.3})
    assert sim(mode="async", cluster={"workers": 4}, simulate={"fail_mtbf": 0.3}) == {**one, "simulator_seconds":
                                                                                        pytest.approx(0, abs=1e9)}
    other = sim(mode="async", cluster={"workers": 4}, simulate={"fail_mtbf": 0.3}, seed=1)
    assert other["wall_seconds"] != one["wall_seconds"]


def test_failures_are_refused_where_they_mean_nothing():
    with pytest.raises(ConfigError, match="simulate.fail_down: is how long a failed or killed worker stays down"):
        from_dict(SimulationConfig, {"simulate": {"fail_down": 2.0}})
    with pytest.raises(ConfigError, match="simulate.fail_mtbf: failures at the learning level"):
        from_dict(SimulationConfig, {"simulate": {"fail_mtbf": 1.0, "level": "learning"}})
    with pytest.raises(ValueError, match="too short"):
        sim(mode="async", cluster={"workers": 1}, job={"steps": 2}, simulate={"fail_mtbf": 0.0005})


@pytest.mark.parametrize("mode, expected", [("async", (3 * 60 + 60 // 4) / (4 * 60)), ("sync", 0.25)])
def test_goodput_while_every_rank_ran_with_a_4x_straggler(mode, expected):
    """`goodput` is a real run's: useful samples/s from the first push to the first worker done, over the clean
    run's. Async: by the time the 3 fast workers have done their 60 steps the slow one has done 15 (0.8125); sync:
    every clock waits for the slow one, so the whole run goes at its pace (0.25). End to end, both are a quarter."""
    s = sim(mode=mode, cluster={"workers": 4, "servers": 1}, faults={"compute_ms": 20.0, "straggler": "1:4"},
            simulate={"goodput": True, "latency_ms": 0.01})
    assert s["goodput"] == pytest.approx(expected, abs=0.02), s["goodput"]
    assert s["goodput_end_to_end"] == pytest.approx(0.25, abs=0.02)
    clean = sim(mode=mode, cluster={"workers": 4, "servers": 1}, simulate={"latency_ms": 0.01})
    assert clean["goodput"] is None and clean["useful_samples_per_second"] == pytest.approx(
        4 * clean["batch_size"] / COMPUTE, rel=0.05)  # four steps of 21 ms at a time, every rank running
    assert s["useful_samples_per_second"] == pytest.approx(s["goodput"] * clean["useful_samples_per_second"])
