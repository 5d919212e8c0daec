"""Delayed Nesterov under `psrv run`'s options and cluster learns with local SGD in every mode. (Each rule's
weights, lr scales and staleness in every mode, over both transports, against the papers' math:
tests/conformance/test_matrix.py.) Over zmq the shards and workers are threads of the test process
(tests/threaded_run.py), as learning is what is checked; the RPC case needs processes (one RPC world per
process) and stays `psrv run`."""

import pytest

from tests.helpers import psrv_run
from tests.threaded_run import threaded_run

@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode,transport,servers", [("async", "zmq", 1), ("ssp", "rpc", 2), ("sync", "zmq", 1)],
                         ids=str)
def test_dn_learns_under_local_sgd(mode, transport, servers, tmp_path):
    """Delayed Nesterov as the outer optimizer of 2 workers taking 5 local steps per push, in each mode."""
    run = psrv_run if transport == "rpc" else threaded_run  # one RPC world per process: rpc stays processes
    s = run(tmp_path, "--mode", mode, "--transport", transport, "--servers", str(servers), "--workers", "2",
            "--local-steps", "5", "--update-rule", "dn", "--optimizer", "sgd", "--momentum", "0.9",
            "--nesterov", "--lr", "0.7", "--steps", "60", timeout=80)
    period = 1 if mode == "sync" else 2  # N: the number of workers; sync steps once per clock on the mean
    assert s["complete"] and s["update_rule"] == "dn" and s["mean_lr_scale"] == 1 / period, s
    assert s["eval_accuracy"] > 0.5, s  # from 0.08 at the start
