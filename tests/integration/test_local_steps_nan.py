"""One NaN costs one push under local steps (docs/compression.md, "A non-finite gradient"): worker 1's loss
is NaN at its inner step 2 (tests/conformance/job.py's tiny_nan), the shards drop that round's push
(--nonfinite skip), and every later push of it is applied, with inner AdamW (the default, whose moments a
NaN step would leave NaN) and with streaming DiLoCo's fragments (whose merge would keep NaN weights). Runs in
threads (tests/threaded_run.py); the inner step itself: tests/unit/test_inner_step.py."""
import json
import logging

import pytest
import torch

from tests.threaded_run import threaded_run

STEPS, H = 24, 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fragments", [1, 2])
def test_one_nan_costs_one_push_with_inner_adamw(fragments, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="psrv.worker")
    summary = threaded_run(tmp_path, "--job", "tests/conformance/job.py:tiny_nan", "--mode", "sync", "--workers", "2",
                           "--servers", "1", "--steps", str(STEPS), "--batch-size", "16", "--local-steps", str(H),
                           "--fragments", str(fragments), "--nonfinite", "skip")
    shard = json.loads((tmp_path / "server-0.json").read_text())
    pushes = 2 * STEPS // (H // fragments)
    assert (summary["pushes"], shard["pushes"]) == (pushes, pushes), summary
    assert shard["dropped"] == {"invalid": 1}, shard  # before: every push of worker 1 from the NaN on (6; 11 with F 2)
    assert shard["pushes_applied"] == pushes - 1, shard
    said = [r.getMessage() for r in caplog.records if "NaN or Inf" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("worker 1:"), said
    assert all(torch.isfinite(torch.load(tmp_path / "params.pt"))), "rank 0's weights are not finite"

