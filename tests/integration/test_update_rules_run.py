"""Delayed Nesterov under `psrv run`, as real processes, learns with local SGD in every mode. (Each rule's
weights, lr scales and staleness in every mode, over both transports, against the papers' math:
tests/conformance/test_matrix.py.)"""

import pytest

from tests.helpers import psrv_run

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
