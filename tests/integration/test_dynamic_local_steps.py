"""`--local-steps auto:H` (dynamic local updates) under `psrv run`: a worker three times slower plans
about a third of H inner steps per round from the speeds the servers pass on, and both run the same
rounds. (Their push rates are not asserted: wall time on a shared machine is the benchmarks' business;
docs/algorithms.md gives the measured rates.) Over zmq the shards and workers are threads of the test
process (tests/threaded_run.py), as the plan is what is checked; the RPC case needs processes (one RPC
world per process) and stays `psrv run`."""
import json

import pytest

from tests.helpers import psrv_run
from tests.threaded_run import threaded_run

# 40 ms of emulated compute (a sleep) a step, 120 ms for the straggler: with 15 ms, the CPU time a loaded
# 2-core machine adds to both workers' steps hid the factor of 3 (a plan of 5 inner steps, not 2)
COMMON = ("--workers", "2", "--compute-ms", "40", "--straggler", "1:3", "--local-steps", "auto:6",
          "--steps", "36", "--inner-lr", "0.003", "--optimizer", "sgd", "--lr", "1.0", "--momentum", "0")


def _workers(out) -> list[dict]:
    return [json.loads((out / f"worker-{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode,transport,servers", [("async", "zmq", 1), ("sync", "rpc", 2), ("ssp", "zmq", 2)],
                         ids=str)
def test_a_slow_worker_takes_fewer_inner_steps_and_keeps_the_push_rate(mode, transport, servers, tmp_path):
    run = psrv_run if transport == "rpc" else threaded_run  # one RPC world per process: rpc stays processes
    s = run(tmp_path, "--mode", mode, "--transport", transport, "--servers", str(servers), *COMMON, timeout=140)
    fast, slow = _workers(tmp_path)
    assert s["complete"] and s["local_steps"] == "auto:6", s
    # every worker runs ceil(36 / 6) = 6 rounds; the fastest takes H = 6 inner steps in each
    assert len(fast["inner_steps_per_push"]) == len(slow["inner_steps_per_push"]) == 6, (fast, slow)
    assert fast["inner_steps_per_push"] == [6] * 6 and fast["inner_steps"] == 36, fast
    # the slow one: H in its first round (no speeds known yet), then about floor(6 / 3) = 2
    assert slow["inner_steps_per_push"][0] == 6 and max(slow["inner_steps_per_push"][2:]) <= 3, slow
    assert s["inner_steps_per_push"] == [6.0, pytest.approx(sum(slow["inner_steps_per_push"]) / 6, abs=1e-3)]
    assert slow["inner_steps"] <= 0.6 * fast["inner_steps"], slow  # the same rounds on fewer inner steps
    assert s["final_loss"] < s["initial_loss"], s
