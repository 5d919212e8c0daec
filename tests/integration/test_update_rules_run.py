"""Delayed Nesterov under `psrv run`'s options and cluster learns with local SGD in every mode. (Each rule's
weights, lr scales and staleness in every mode, over both transports, against the papers' math:
tests/conformance/test_matrix.py.) Over zmq the shards and workers are threads of the test process
(tests/threaded_run.py), as learning is what is checked; the RPC case needs processes (one RPC world per
process) and stays `psrv run`."""

import pytest

from psrv.partition import shard_range

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


@pytest.mark.timeout(90)
def test_heloco_learns_and_its_summary_counts_every_block(tmp_path):
    """HeLoCo as the outer optimizer of 2 async workers with 5 local steps, on 2 shards of `psrv run`: it learns,
    and summary.json's rule_counts hold one verdict per block of every applied push (blocks of 512 elements of
    each shard's slice), most of them corrections."""
    s = psrv_run(tmp_path, "--mode", "async", "--servers", "2", "--workers", "2", "--local-steps", "5",
                 "--update-rule", "heloco", "--heloco-block", "512", "--heloco-keep", "0.9", "--optimizer", "sgd",
                 "--momentum", "0.9", "--nesterov", "--lr", "0.7", "--steps", "60", timeout=80)
    assert s["complete"] and s["update_rule"] == "heloco", s
    counts = s["rule_counts"]
    assert set(counts) == {"blocks_kept", "blocks_shrunk", "blocks_reoriented"}, counts
    blocks = [-(-(hi - lo) // 512) for lo, hi in (shard_range(s["parameters"], 2, k) for k in range(2))]
    want = sum(n * updates for n, updates in zip(blocks, s["updates_applied_per_shard"]))
    assert sum(counts.values()) == want, (counts, blocks, s["updates_applied_per_shard"])
    assert counts["blocks_reoriented"] + counts["blocks_shrunk"] > counts["blocks_kept"], counts
    assert s["eval_accuracy"] > 0.5, s
