"""The checkpoint_latency bench runs at a tiny size and its row holds figures of this run. Its shards are
served from threads of the test process (`in_thread`): the test proves the bench runs and reports what
it measured, not how fast a shard process is, and each shard process would be an import of torch."""
import math

import pytest

from psrv.experiments.bench import checkpoint_latency


@pytest.mark.timeout(180)
def test_the_checkpoint_latency_bench_measures_both_variants():
    (row,) = checkpoint_latency.run(size_mb=1, seconds=1.5, every=0.2, in_thread=True)
    assert row["off"]["checkpoints"] == 0 and row["on"]["checkpoints"] >= 1
    assert row["off"]["pushes"] > 0 and row["on"]["pushes"] > 0
    assert math.isfinite(row["ratio"]) and row["ratio"] == row["on"]["p99"] / row["off"]["p99"] > 0
    print(f"\n1 MB adam: push p99 {row['p99_on'] * 1e3:.1f} ms with checkpoints, {row['p99_off'] * 1e3:.1f} ms without")
