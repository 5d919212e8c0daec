"""Dynamic local updates (local_steps 'auto:H', psrv/local_period.py): the parsing, DyLU's plan on
hand cases, a worker's period driven by a clock, and the servers' record of the workers' speeds."""
import math

import pytest

from psrv.config import RunConfig
from psrv.config.base import from_dict
from psrv.local_period import LocalPeriod, fastest_of, parse_local_steps, plan_steps
from psrv.protocol import ProtocolError
from psrv.server.speeds import WorkerSpeeds


def test_parse():
    assert [parse_local_steps(v) for v in (1, 7, "12", "auto", "auto:5")] == [1, 7, 12, "auto:20", "auto:5"]
    for bad in (0, -3, "auto:1", "auto:", "fast", True, 2.5):
        with pytest.raises(ValueError):
            parse_local_steps(bad)
    assert from_dict(RunConfig, {"mode": "async", "worker": {"local_steps": "auto"}}).worker.local_steps == "auto:20"
    with pytest.raises(ValueError, match=r"^worker\.local_steps: 'auto:20' plans .* mode 'ddp' has none"):
        from_dict(RunConfig, {"mode": "ddp", "worker": {"local_steps": "auto"}})


def test_plan_is_dylu_floor_of_h_times_the_speed_ratio():
    # H_i = max(1, floor(H * t_fastest / t_i)): Liu et al. 2024, sec. 4.2
    assert plan_steps(20, 0.010, 0.010) == 20           # the fastest worker keeps H
    assert plan_steps(20, 0.010, 0.030) == 6            # floor(20 / 3) = 6
    assert plan_steps(20, 0.010, 0.025) == 8
    assert plan_steps(20, 0.010, 1.0) == 1              # never below one step
    assert plan_steps(20, 0.010, 0.005) == 20           # faster than the fastest reported: still H
    assert plan_steps(20, math.nan, 0.01) == 20 and plan_steps(20, 0.01, 0.0) == 20


def test_a_period_times_its_inner_steps_and_replans_after_each_push():
    period, clock = LocalPeriod("auto:6", smoothing=1.0), 0.0
    pushes = []
    for step in range(30):
        clock += 0.030  # this worker takes 30 ms per inner step
        if period.stepped(clock):
            assert period.push_fields() == {"step_seconds": pytest.approx(0.030), "inner_steps": period.since_push}
            period.pushed(fastest=0.010)  # the fastest worker takes 10 ms
            pushes.append(step)
        clock += 0.001  # step() itself: not counted as compute
        period.returned(clock)
    assert period.history[0] == 6 and set(period.history[1:]) == {2}, period.history  # floor(6 * 10 / 30) = 2
    fixed, due = LocalPeriod(4), []
    for i in range(8):
        due.append(fixed.stepped(float(i)))
        if due[-1]:
            assert fixed.push_fields() == {"inner_steps": 4}  # no speed of its own: its steps only
            fixed.pushed(fastest=0.001)                     # a fixed H ignores the others' speed
        fixed.returned(i + 0.5)
    assert due == [False, False, False, True] * 2 and fixed.history == [4, 4] and fixed.h == 4
    fixed.stepped(9.0)
    assert fixed.push_fields() == {"inner_steps": 1}        # close()'s push of the steps left over


def test_servers_keep_the_active_workers_fastest_and_refuse_bad_speeds():
    speeds = WorkerSpeeds()
    speeds.report(0, {"step_seconds": 0.03})
    speeds.report(1, {"step_seconds": 0.01})
    speeds.report(2, {})
    assert speeds.fastest({0, 1}) == {"fastest_step_seconds": 0.01}
    assert speeds.fastest({0}) == {"fastest_step_seconds": 0.03}
    speeds.forget(0)
    assert speeds.fastest({0}) == {}
    for bad in (-1.0, 0, math.inf, "fast", True):
        with pytest.raises(ProtocolError):
            speeds.report(3, {"step_seconds": bad})
    assert 3 not in speeds.seconds
    assert fastest_of([{"fastest_step_seconds": 0.02}, {"push": {"fastest_step_seconds": 0.01}}, {}]) == 0.01
    assert fastest_of([{}, {"version": 3}]) is None
