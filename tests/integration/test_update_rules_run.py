"""The update rules under `psrv run`, as real processes: each completes in every mode and over both
transports, and the servers' lr-scale record agrees with their staleness record push for push."""
import json
from collections import Counter

import pytest

from tests.helpers import psrv_run

CASES = [  # (mode, rule, transport, servers): each rule, each mode, both transports, 1 and 2 shards
    ("async", "staleness-lr", "zmq", 1),
    ("async", "dc-asgd", "rpc", 1),
    ("ssp", "dc-asgd-a", "zmq", 2),
    ("sync", "staleness-lr", "zmq", 1),
    ("sync", "dc-asgd", "rpc", 2),
]


def _expected_lr_scales(rule: str, staleness_histogram: dict) -> dict:
    """What the lr-scale histogram must be, from the staleness of every applied push."""
    scales = Counter()
    for tau, n in staleness_histogram.items():
        scales[f"{round(1 / max(1, int(tau)), 6):g}" if rule == "staleness-lr" else "1"] += n
    return dict(scales)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,rule,transport,servers", CASES, ids=lambda v: str(v))
def test_rule_runs_and_records_its_lr_scale(mode, rule, transport, servers, tmp_path):
    s = psrv_run(tmp_path, "--mode", mode, "--update-rule", rule, "--transport", transport,
                 "--servers", str(servers), "--workers", "3", "--steps", "30", timeout=100)
    assert s["complete"] and s["update_rule"] == rule, s
    assert s["final_loss"] < s["initial_loss"], s
    for k in range(servers):
        shard = json.loads((tmp_path / f"server-{k}.json").read_text())
        assert shard["update_rule"] == rule and shard["dropped"] == {}, shard
        if mode == "sync":  # one step per clock, on the mean, at scale 1
            assert shard["lr_scale_histogram"] == {"1": 30} and shard["mean_lr_scale"] == 1.0, shard
        else:  # one step per push, scaled by 1/max(1, τ) under staleness-lr
            assert shard["lr_scale_histogram"] == _expected_lr_scales(rule, shard["staleness_histogram"]), shard
    shard0 = json.loads((tmp_path / "server-0.json").read_text())
    assert s["lr_scale_histogram"] == shard0["lr_scale_histogram"]
    if rule == "staleness-lr" and mode != "sync":
        assert s["max_staleness"] >= 2 and s["mean_lr_scale"] < 1.0, s  # 3 workers in async/ssp: stale pushes
    else:
        assert s["mean_lr_scale"] == 1.0, s


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode,transport,servers", [("async", "zmq", 1), ("ssp", "rpc", 2), ("sync", "zmq", 1)],
                         ids=str)
def test_dn_learns_under_local_sgd(mode, transport, servers, tmp_path):
    """Delayed Nesterov as the outer optimizer of 2 workers taking 5 local steps per push, in each mode."""
    s = psrv_run(tmp_path, "--mode", mode, "--transport", transport, "--servers", str(servers), "--workers", "2",
                 "--local-steps", "5", "--update-rule", "dn", "--optimizer", "sgd", "--momentum", "0.9",
                 "--nesterov", "--lr", "0.7", "--steps", "60", timeout=80)
    period = 1 if mode == "sync" else 2  # N: the number of workers; sync steps once per clock on the mean
    assert s["complete"] and s["update_rule"] == "dn" and s["mean_lr_scale"] == 1 / period, s
    assert s["eval_accuracy"] > 0.5, s  # from 0.08 at the start
